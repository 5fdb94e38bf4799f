"""How a command that waits (deploy, task, invoke) shows what it is waiting for, on stderr."""

from __future__ import annotations

import shutil
import time
from typing import IO

from nvcf_mono.printable import one_line


class Progress:
    """``[  12s] <line>``: a live line rewritten in place on a terminal; elsewhere a line per change.

    Only changes are printed to a pipe or file so a long wait does not fill a log with repeats.
    """

    def __init__(self, stream: IO[str], started: float | None = None) -> None:
        self._stream = stream
        self._started = time.monotonic() if started is None else started
        self._tty = stream.isatty()
        self._last: str | None = None

    def show(self, line: str) -> None:
        """The current state, in one line (what it quotes from the server shown, never obeyed)."""
        line = one_line(line)
        elapsed = f"[{time.monotonic() - self._started:4.0f}s]"
        if self._tty:
            width = shutil.get_terminal_size((120, 24)).columns - 1
            self._stream.write(f"\r\x1b[K{elapsed} {line}"[: width + 4])  # + 4: the escape sequence
            self._stream.flush()
        elif line != self._last:
            print(f"{elapsed} {line}", file=self._stream, flush=True)
        self._last = line

    def close(self) -> None:
        """End the live line, so what follows starts on a line of its own (safe to call twice)."""
        if self._tty and self._last is not None:
            self._stream.write("\n")
            self._stream.flush()
        self._last = None
