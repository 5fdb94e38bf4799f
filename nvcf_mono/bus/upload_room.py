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

from collections.abc import AsyncIterable, AsyncIterator, Callable

from nvcf_mono.bus.api import Bus
from nvcf_mono.config.model import Settings


def store_size(settings: Settings, account_limit: int | None) -> int | None:
    """The message store's size as far as this node can know it."""
    if settings.uploads.store_size is not None:
        return settings.uploads.store_size
    known = [] if account_limit is None else [account_limit]
    if settings.bus.url is None:
        known.append(settings.embedded_nats.max_file_store)
    return min(known) if known else None


async def upload_room(bus: Bus, settings: Settings) -> int | None:
    """Bytes uploads may still add before the store's reserve (0: none); None when the store's size is unknown.

    One JetStream API call. Several uploads at once each see the room before the others: together they
    may pass into the reserve by what they bring at the same time, never fill the store (JetStream's own
    limit still refuses that).
    """
    usage = await bus.usage()
    size = store_size(settings, usage.max_storage)
    if size is None:
        return None
    return max(0, int(size * (1.0 - settings.uploads.reserve)) - usage.storage)


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
