"""Each request's own directory (its large output, its input assets), made and removed cheaply.

A request gets ``<base>/<request id>``. On a journalled file system making a directory and removing
it again cost 150-250 µs of kernel time each, about a quarter of the worker's whole cost of a small
request. So a finished request's directory the server left empty is not removed: it is kept,
under its old name, as a spare, and when the next request comes it is looked at again (a late
write must not reach another request) and renamed to the new id, all on the event loop, no thread
hand-off. Whether a directory is still empty is inotify's answer where it can give one
(:mod:`.dir_events`: one read of its queue), else a read of the directory. Directories with files
in them are removed in batches off the event loop.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from typing import final

import anyio
import anyio.to_thread

from nvcf_mono.worker.dir_events import DirEvents


@final
class Scratch:
    """Directories under one base, one per request, recycled; :meth:`run` removes what is not."""

    #: How long directories to remove gather before a batch goes to a thread.
    BATCH_DELAY = 0.1

    def __init__(self, base: str, *, keep: int, on_left: Callable[[str], None] | None = None) -> None:
        self._base = base
        self._keep = keep
        #: Told of a directory its request left files in (before they are removed); None: nobody asks.
        self.on_left = on_left
        #: Finished requests' directories, to be renamed for the next ones if still empty (a dict
        #: for its order and a quick lookup: a redelivery may name one of them).
        self._spares: dict[str, None] = {}
        self._pending: list[str] = []
        self._wake = anyio.Event()
        self._events = DirEvents()

    def make(self, name: str) -> str:
        """``<base>/<name>``, present (empty unless a redelivery left something); raises OSError."""
        path = os.path.join(self._base, name)
        if path in self._spares:
            del self._spares[path]
            return path  # a redelivery: its own earlier attempt's directory, as that left it
        while self._spares:
            spare, _ = self._spares.popitem()
            if not self._still_empty(spare):
                self._remove_soon(spare)  # written into after its request ended
                continue
            try:
                os.rename(spare, path)  # onto nothing, or onto an empty directory of an earlier delivery
                self._events.moved(spare, path)
                return path
            except OSError:
                if os.path.isdir(spare):
                    self._spares[spare] = None  # the path holds files of an earlier delivery: keep them
                break
        try:
            os.mkdir(path)
            if self._keep:
                self._events.track(path)  # found empty when its request ends, then cheap to recycle
                self._events.found_empty(path)  # made just now, named to nobody yet
        except FileExistsError:
            pass  # a redelivery to this instance
        except FileNotFoundError:
            os.makedirs(path, exist_ok=True)  # the base went away
        return path

    def untouched(self, path: str) -> bool:
        """True when the kernel says nothing was added to ``path`` since it was found empty (False: unknown)."""
        return self._events.unchanged(path)

    def release(self, path: str) -> None:
        """The request is over: its directory is kept as a spare if empty, else removed (soon)."""
        empty = self._still_empty(path)
        if empty and len(self._spares) < self._keep:
            self._spares[path] = None
            return
        if not empty and self.on_left is not None:
            self.on_left(path)
        self._remove_soon(path)

    def _still_empty(self, path: str) -> bool:
        if self._events.unchanged(path):
            return True
        self._events.track(path)  # before the read: what is added after it is in the event queue
        if not _empty(path):
            return False
        self._events.found_empty(path)
        return True

    def _remove_soon(self, path: str) -> None:
        self._events.forget(path)
        self._pending.append(path)
        self._wake.set()

    async def run(self) -> None:
        try:
            while True:
                await self._wake.wait()
                self._wake = anyio.Event()
                await anyio.sleep(self.BATCH_DELAY)
                batch, self._pending = self._pending, []
                await anyio.to_thread.run_sync(_remove_all, batch)
        finally:
            # Stopping: whatever is left, now, and no spares kept.
            _remove_all([*self._pending, *self._spares])
            self._pending.clear()
            self._spares.clear()
            self._events.close()


def _remove_all(paths: list[str]) -> None:
    for path in paths:
        _remove(path)


def _empty(path: str) -> bool:
    try:
        with os.scandir(path) as entries:
            return next(entries, None) is None
    except OSError:
        return False


def _remove(path: str) -> None:
    try:
        os.rmdir(path)  # a directory the inference server left empty: the usual case
    except FileNotFoundError:
        pass
    except OSError:
        shutil.rmtree(path, ignore_errors=True)
