"""In-process queues (anyio memory object streams) on the hot path."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TypeVar

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream

T = TypeVar("T")


async def eagerly(receive: MemoryObjectReceiveStream[T]) -> AsyncIterator[T]:
    """The items of ``receive`` until it is closed; what is already queued comes without a loop turn.

    ``async for`` over the stream itself yields to the event loop on every item, which a per-request
    sender pays several times per request.
    """
    while True:
        try:
            item = receive.receive_nowait()
        except anyio.WouldBlock:
            try:
                item = await receive.receive()
            except anyio.EndOfStream:
                return
        except anyio.EndOfStream:
            return
        yield item
