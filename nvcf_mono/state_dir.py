"""The state directory: one host at a time (an exclusive lock), and private files written atomically."""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from nvcf_mono.errors import NvcfMonoError

LOCK_NAME = "host.lock"
#: Written by a ready host: its URLs and credentials, read by the CLI (kept here so the CLI need not import the host).
ENDPOINTS_FILE = "endpoints.json"


class StateDirBusy(NvcfMonoError):
    """Another live host holds this state directory."""


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` (and parents) readable only by this user."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


@contextlib.contextmanager
def lock_state_dir(path: Path) -> Iterator[Path]:
    """Hold the state directory for this process; a second host on it fails at once with the holder's pid.

    The lock is an ``flock`` on ``host.lock``: the kernel releases it when the process dies, even by
    SIGKILL, so a crashed host never blocks its successor.
    """
    ensure_private_dir(path)
    lock_path = path / LOCK_NAME
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)  # not inherited by children (O_CLOEXEC)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            raise StateDirBusy(
                f"state directory {path} is in use by another nvcf-mono (pid {holder}); stop it or pass --state-dir"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield path
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def write_private(path: Path, data: bytes, *, mode: int = 0o600) -> None:
    """Replace ``path`` atomically with ``data``, mode 0600 (or ``mode``) from the first byte.

    The scratch file has a name nobody can guess and is created exclusively, never through a link:
    an instance directory is shared with a function's processes, which could otherwise plant a
    link where the writer (root, or the worker) is about to write.
    """
    ensure_private_dir(path.parent)
    fd, scratch = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    tmp = Path(scratch)
    os.fchmod(fd, mode)  # whatever the umask
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    with contextlib.suppress(OSError):  # make the rename durable where the platform allows it
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
