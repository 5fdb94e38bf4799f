"""Whether anything was added to a directory since it was last found empty, from inotify.

A request's directory is checked for files when the request ends and again before it is renamed for
the next one: a directory read each time (five system calls) was about a tenth of the worker's CPU
per request. The kernel says instead: a watched directory that had no entry created or moved into it
since it was found empty is still empty, and one reading of the event queue answers for all of them.

Linux only. Elsewhere, when the kernel refuses another inotify instance or watch, or when its event
queue overflowed, the answer is "unknown" and the caller reads the directory itself.
"""

from __future__ import annotations

import array
import fcntl
import logging
import os
import struct
import sys
import termios
from typing import Any, final

log = logging.getLogger("nvcf_mono.worker")

_IN_MOVED_TO, _IN_CREATE, _IN_Q_OVERFLOW, _IN_ONLYDIR = 0x80, 0x100, 0x4000, 0x01000000
#: struct inotify_event: wd, mask, cookie, len (then len bytes of name).
_EVENT = struct.Struct("iIII")


@final
class DirEvents:
    """Watches over directories; :meth:`close` when done (opened at the first :meth:`track`)."""

    def __init__(self) -> None:
        self._fd = -1
        self._libc: Any = None
        self._unavailable = sys.platform != "linux"
        self._watches: dict[str, int] = {}
        #: Watches whose directory was found empty with no entry added since.
        self._quiet: set[int] = set()
        #: Bytes waiting in the event queue, as the kernel last said.
        self._queued = array.array("i", [0])

    def track(self, path: str) -> None:
        """Watch ``path`` from now on (a no-op when it is already watched, or cannot be)."""
        if path in self._watches or not self._open():
            return
        wd = self._libc.inotify_add_watch(self._fd, os.fsencode(path), _IN_CREATE | _IN_MOVED_TO | _IN_ONLYDIR)
        if wd < 0:
            log.debug("not watching %s (%s): it is read each time", path, os.strerror(_errno()))
            return
        self._watches[path] = wd

    def unchanged(self, path: str) -> bool:
        """True when ``path`` is watched and nothing was added to it since :meth:`found_empty`."""
        wd = self._watches.get(path)
        if wd is None or wd not in self._quiet:
            return False
        self._read_events()
        return wd in self._quiet

    def found_empty(self, path: str) -> None:
        """``path`` was read and is empty; call after :meth:`track` or :meth:`unchanged`, so that an entry
        added after the read is still in the event queue.
        """
        wd = self._watches.get(path)
        if wd is not None:
            self._quiet.add(wd)

    def moved(self, old: str, new: str) -> None:
        """``old`` was renamed ``new`` (the watch follows the directory)."""
        wd = self._watches.pop(old, None)
        if wd is not None:
            self._watches[new] = wd

    def forget(self, path: str) -> None:
        """``path`` is going away (the kernel drops its watch when it is removed)."""
        wd = self._watches.pop(path, None)
        if wd is not None:
            self._quiet.discard(wd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = -1
        self._watches.clear()
        self._quiet.clear()

    def _open(self) -> bool:
        if self._fd >= 0:
            return True
        if self._unavailable:
            return False
        import ctypes  # here: only a worker that keeps directories needs it

        self._libc = ctypes.CDLL(None, use_errno=True)
        fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            self._unavailable = True
            log.debug("no inotify instance (%s): request directories are read each time", os.strerror(_errno()))
            return False
        self._fd = fd
        return True

    def _read_events(self) -> None:
        while True:
            try:
                # Asked first: usually nothing is queued, and a read that finds nothing raises, which
                # costs four times as much as this question.
                fcntl.ioctl(self._fd, termios.FIONREAD, self._queued, True)
                if not self._queued[0]:
                    return
                data = os.read(self._fd, 64 * 1024)
            except BlockingIOError:
                return
            except OSError as err:
                # Never a request's failure: without its answers each directory is read instead.
                log.warning("inotify failed (%s): request directories are read each time from now on", err)
                self.close()
                self._unavailable = True
                return
            offset = 0
            while offset < len(data):
                wd, mask, _, size = _EVENT.unpack_from(data, offset)
                offset += _EVENT.size + size
                if mask & _IN_Q_OVERFLOW:
                    self._quiet.clear()  # events were lost: nothing is known to be empty
                else:
                    self._quiet.discard(wd)  # an entry added, or the watch gone with its directory


def _errno() -> int:
    import ctypes

    return ctypes.get_errno()
