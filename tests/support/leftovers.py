"""Processes a test left running: instances, servers and CLIs whose working directory, command line or
environment lies in the test's ``tmp_path``. One failed test must not leave an instance behind for the
next test on the same worker to count (tests tell processes apart by cluster id, which a worker's tests
share)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from tests.support.procs import live_processes


def processes_under(directory: Path) -> list[int]:
    """Pids of live processes (not this one) that work in, or name, ``directory``."""
    root = str(directory.resolve())
    # The directory itself or a path inside it, never a sibling that merely starts with its name.
    markers = ((root + "/").encode(), (root + "\0").encode())

    def in_it(text: bytes) -> bool:
        return any(marker in text for marker in markers)

    found = []
    for proc in live_processes():
        cwd = proc.cwd()
        if cwd == root or cwd.startswith(root + "/") or in_it(proc.cmdline()) or in_it(b"\0".join(proc.environ())):
            found.append(proc.pid)
    return found


def kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
