"""A container's log as an engine or the Kubernetes API gives it, each line after its time: which lines
were not copied yet, when the log is read again from a moment before the last line copied.

Reads ask from a whole second before (Podman's ``since`` is whole seconds; the Kubernetes backend asks a
margin earlier for clocks that differ), so a read repeats lines. A :data:`Mark` says how far copying got:
the last line's stamp, and how many lines with that very stamp were copied (Podman stamps to the second,
so several lines share one).
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import final

#: The stamp of the last line copied (Unix seconds, nanoseconds) and how many lines with it were copied.
Mark = tuple[int, int, int]
_STAMP = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d) ")


@final
class StampedLines:
    """One read of a stamped log, taken a line at a time, against what was copied before it (``mark``)."""

    def __init__(self, mark: Mark | None) -> None:
        self._last: tuple[int, int] | None = (mark[0], mark[1]) if mark is not None else None
        self._copied = mark[2] if mark is not None else 0
        self._same = 0  # lines of this read stamped ``_last``
        self._keep = mark is None

    @property
    def mark(self) -> Mark | None:
        """How far copying got, with every line :meth:`new` returned."""
        return None if self._last is None else (*self._last, self._copied)

    def new(self, line: str) -> str | None:
        """``line`` without its stamp when it was not copied yet, else None. A line whose stamp cannot be
        read goes with the line before it.
        """
        m = _STAMP.match(line)
        if m is not None:
            base, frac, zone = m.groups()
            when = datetime.fromisoformat(base + ("+00:00" if zone == "Z" else zone))
            instant = (int(when.timestamp()), int((frac or "0").ljust(9, "0")))
            if self._last is None or instant > self._last:
                self._last, self._same, self._copied, self._keep = instant, 1, 1, True
            elif instant == self._last:
                self._same += 1
                self._keep = self._same > self._copied
                self._copied = max(self._copied, self._same)
            else:
                self._keep = False
            line = line[m.end() :]
        return line if self._keep else None


def new_lines(raw: str, mark: Mark | None) -> tuple[str, Mark | None]:
    """The lines of ``raw`` (one read, each line stamped, in order) after ``mark``, without their stamps,
    and the new mark.
    """
    read = StampedLines(mark)
    fresh = [text for line in raw.splitlines(keepends=True) if (text := read.new(line)) is not None]
    return "".join(fresh), read.mark
