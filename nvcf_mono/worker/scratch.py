"""Each request's own directory (its large output, its input assets), made and removed cheaply.

A request gets ``<base>/<request id>``. On a journalled file system making a directory and removing
it again cost 150-250 µs of kernel time each, about a quarter of the worker's whole cost of a small
request. So a directory the inference server left empty is not removed: it is kept as a spare and
renamed to the next request's id (a rename within one directory costs a fraction of a mkdir). Ones
with files in them are removed, in batches off the event loop.
"""

from __future__ import annotations

import itertools
import os
import shutil
from typing import final

import anyio
import anyio.to_thread

#: Spares are hidden names in the base directory, never a request id (ids are UUIDs).
SPARE_PREFIX = ".spare-"


@final
class Scratch:
    """Directories under one base, one per request, recycled; :meth:`run` does the clearing up."""

    #: How long finished directories gather before a batch goes to a thread.
    BATCH_DELAY = 0.1

    def __init__(self, base: str, *, keep: int) -> None:
        self._base = base
        self._keep = keep
        #: Empty directories ready to be renamed (appended by the clearing thread, popped on the loop).
        self._spares: list[str] = []
        self._pending: list[str] = []
        self._wake = anyio.Event()
        self._names = itertools.count()
        self._prefix = f"{SPARE_PREFIX}{os.getpid()}-"

    def make(self, name: str) -> str:
        """``<base>/<name>``, present (empty unless a redelivery left something); raises OSError."""
        path = os.path.join(self._base, name)
        while self._spares:
            spare = self._spares.pop()
            try:
                os.rename(spare, path)  # onto nothing, or onto an empty directory of an earlier delivery
                return path
            except OSError:
                if os.path.isdir(spare):
                    self._spares.append(spare)  # the path holds files of an earlier delivery: keep them
                break
        try:
            os.mkdir(path)
        except FileExistsError:
            pass  # a redelivery to this instance
        except FileNotFoundError:
            os.makedirs(path, exist_ok=True)  # the base went away
        return path

    def release(self, path: str) -> None:
        """The request is over: its directory is kept as a spare if empty, else removed (soon)."""
        self._pending.append(path)
        self._wake.set()

    async def run(self) -> None:
        try:
            while True:
                await self._wake.wait()
                self._wake = anyio.Event()
                await anyio.sleep(self.BATCH_DELAY)
                batch, self._pending = self._pending, []
                await anyio.to_thread.run_sync(self._clear, batch)
        finally:
            self._clear(self._pending)  # stopping: whatever is left, now, and no spares kept
            for spare in self._spares:
                _remove(spare)
            self._spares.clear()

    def _clear(self, paths: list[str]) -> None:
        for path in paths:
            if len(self._spares) < self._keep and _empty(path):
                spare = os.path.join(self._base, f"{self._prefix}{next(self._names)}")
                try:
                    os.rename(path, spare)
                except OSError:
                    _remove(path)
                else:
                    self._spares.append(spare)
            else:
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
