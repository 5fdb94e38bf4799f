"""The machine's live processes, read from ``/proc`` once per question: what each test helper that looks for
processes (by command line, environment or working directory) filters."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import final


@final
class Process:
    """One live process; each part is read when asked for (empty when it is gone or unreadable)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._dir = Path("/proc") / str(pid)

    def _read(self, name: str) -> bytes:
        try:
            return (self._dir / name).read_bytes()
        except OSError:
            return b""

    def cmdline(self) -> bytes:
        """Its arguments, each ending in NUL."""
        return self._read("cmdline")

    def environ(self) -> list[bytes]:
        """Its environment entries (``NAME=value``)."""
        return self._read("environ").split(b"\0")

    def cwd(self) -> str:
        try:
            return os.readlink(self._dir / "cwd")
        except OSError:
            return ""


def alive(pid: int) -> bool:
    """The process exists and is not a zombie (checked without psutil)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


def live_processes() -> Iterator[Process]:
    """Every live process but this one."""
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != me and alive(int(entry.name)):
            yield Process(int(entry.name))


def describe(pid: int) -> str:
    """Where a process is, for a test's failure message: its state and what each thread waits in."""
    base = Path(f"/proc/{pid}")
    try:
        stat = (base / "stat").read_text()
    except OSError:
        return f"process {pid} is gone (reaped)"
    threads = []
    for task in sorted((base / "task").glob("*")):
        try:
            threads.append(f"{task.name}:{(task / 'wchan').read_text() or '-'}")
        except OSError:
            continue
    try:
        signals = [line for line in (base / "status").read_text().splitlines() if line.startswith(("SigBlk", "SigIgn"))]
    except OSError:
        signals = []
    state = stat[stat.rindex(")") + 2]
    return f"process {pid} state {state}, threads waiting in {' '.join(threads) or '?'}; {', '.join(signals)}"
