"""Processes a test left running: instances, servers and CLIs whose working directory, command line or
environment lies in the test's ``tmp_path``. One failed test must not leave an instance behind for the
next test on the same worker to count (tests tell processes apart by cluster id, which a worker's tests
share)."""

from __future__ import annotations

import os
import signal
from pathlib import Path


def processes_under(directory: Path) -> list[int]:
    """Pids of live processes (not this one) that work in, or name, ``directory``."""
    root = str(directory.resolve())
    # The directory itself or a path inside it, never a sibling that merely starts with its name.
    markers = ((root + "/").encode(), (root + "\0").encode())
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                continue
            cwd = os.readlink(entry / "cwd")
            texts = [(entry / "cmdline").read_bytes() + b"\0", (entry / "environ").read_bytes() + b"\0"]
            named = any(marker in text for marker in markers for text in texts)
        except (OSError, IndexError):
            continue
        if named or cwd == root or cwd.startswith(root + "/"):
            found.append(int(entry.name))
    return found


def kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
