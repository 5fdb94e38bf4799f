"""How much tenants' uploads may still add to the message store.

Uploads are what a tenant can put in the store in bulk: asset content, task results, request bodies
too large for their message, and large answers or zipped large responses kept for a caller. They
share the JetStream store with queued requests, small results and the platform's own records.
They may fill it up to its reserve (``uploads.reserve``), never past: what is left stays for the
work every account depends on. The store's size is ``uploads.store_size`` when set, else the
embedded server's ``max_file_store`` or the account's JetStream limit (the smaller when both are
known); with none of them the platform cannot tell, and keeps no reserve.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Callable
from typing import final

import anyio

from nvcf_mono.bus.api import Bus
from nvcf_mono.config.model import Settings

#: Least seconds between two looks at the store's use while uploads come in: what other nodes' uploads
#: add is seen this late at most.
REFRESH = 0.25


def store_size(settings: Settings, account_limit: int | None) -> int | None:
    """The message store's size as far as this node can know it."""
    if settings.uploads.store_size is not None:
        return settings.uploads.store_size
    known = [] if account_limit is None else [account_limit]
    if settings.bus.url is None:
        known.append(settings.embedded_nats.max_file_store)
    return min(known) if known else None


def upload_room(bus: Bus, settings: Settings) -> UploadRoom:
    """The room uploads have left, shared by every upload that goes through ``bus`` (one per process)."""
    room = _ROOMS.get(bus)
    if room is None:
        room = _ROOMS[bus] = UploadRoom(bus, settings)
    return room


@final
class UploadRoom:
    """Bytes uploads may still add before the store's reserve, shared by the uploads this process takes in.

    A look at the store's use is one JetStream API call; every byte an upload brings after it is taken
    off the room it saw, whichever upload brings it. So uploads made at once share the room, where
    each seeing all of it let a burst of them fill the reserve up to the store's own limit. Other
    nodes' uploads are seen at the next look: at most ``REFRESH`` seconds late while bytes come in,
    and always before one is refused.
    """

    def __init__(self, bus: Bus, settings: Settings) -> None:
        self._bus = bus
        self._settings = settings
        self._seen: int | None = None  # the room at the last look (None: the store's size is unknown)
        self._at = -REFRESH
        self._since = 0  # bytes brought since the last look began
        self._promised = 0  # bytes announced by uploads under way and not brought yet
        self._looking: anyio.Event | None = None

    async def left(self) -> int | None:
        """Bytes uploads may still add now (0: none); None when the store's size is unknown. Always a
        fresh look (or the one under way): an upload is refused on what the store holds, not on an estimate.
        """
        await self._look()
        return None if self._seen is None else max(0, self._seen - self._since - self._promised)

    async def hold(
        self,
        data: bytes | AsyncIterable[bytes],
        refuse: Callable[[], BaseException],
        *,
        credit: int = 0,
        declared: int | None = None,
    ) -> AsyncGenerator[bytes, None]:
        """``data`` as it comes, taken off the room; ``refuse()`` is raised when the room is spent.

        ``credit``: what storing it frees (content it replaces). ``declared``: its announced size, taken
        off the room before its first byte, so that of uploads made at once the first ones get their
        room whole (refused at once when it is not there); close the iterator when done with it
        (``contextlib.aclosing``) to give back what did not come. A refusal is only made on a fresh look.
        Raised inside an object-store put, ``refuse()`` fails the put, which keeps nothing it had stored.
        """
        pieces: AsyncIterable[bytes] = _once(data) if isinstance(data, bytes) else data
        promised = 0
        if declared is not None:
            await self._make_room(declared - credit, refuse)
            promised = declared
            self._promised += promised
        try:
            async for chunk in pieces:
                covered = min(len(chunk), promised)
                # Counted once a look is made: what a look began after is taken as stored, this is not yet.
                await self._make_room(len(chunk) - covered - credit if len(chunk) > covered else 0, refuse)
                promised -= covered
                self._promised -= covered
                self._since += len(chunk)
                yield chunk
        finally:
            self._promised -= promised

    async def _make_room(self, more: int, refuse: Callable[[], BaseException]) -> None:
        """Look again when the last look is old or ``more`` bytes do not fit in it; refuse when they do not fit."""
        if time.monotonic() - self._at >= REFRESH or self._short(more):
            await self._look()
            if self._short(more):
                raise refuse()

    def _short(self, more: int) -> bool:
        return more > 0 and self._seen is not None and self._seen < self._since + self._promised + more

    async def _look(self) -> None:
        """Look at the store's use again (a look under way serves every caller that waits for it)."""
        if self._looking is not None:
            await self._looking.wait()
            return
        self._looking = looking = anyio.Event()
        brought = self._since
        try:
            usage = await self._bus.usage()
            size = store_size(self._settings, usage.max_storage)
            # What was brought before the look is in the store's use (or was given up); what came
            # while it was made may not be, so it stays counted.
            reserve = self._settings.uploads.reserve
            self._seen = None if size is None else max(0, int(size * (1.0 - reserve)) - usage.storage)
            self._since -= brought
            self._at = time.monotonic()
        finally:
            self._looking = None
            looking.set()


_ROOMS: weakref.WeakKeyDictionary[Bus, UploadRoom] = weakref.WeakKeyDictionary()


async def _once(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def held_to(
    data: bytes | AsyncIterable[bytes], most: int, refuse: Callable[[], BaseException]
) -> AsyncIterator[bytes]:
    """``data`` as it comes, until it passes ``most`` bytes: then ``refuse()`` is raised.

    Raised inside an object-store put, it fails the put, which keeps nothing of what it had stored.
    """
    if isinstance(data, bytes):
        if len(data) > most:
            raise refuse()
        yield data
        return
    size = 0
    async for chunk in data:
        size += len(chunk)
        if size > most:
            raise refuse()
        yield chunk
