"""In-process queues on the hot path."""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import AsyncIterator
from typing import Generic, TypeVar

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream

T = TypeVar("T")


async def batches(receive: MemoryObjectReceiveStream[T], most: int) -> AsyncIterator[list[T]]:
    """The items of ``receive`` until it is closed, as lists of what was queued together (up to ``most``).

    Waits only when nothing is queued: a sender that writes a batch at a time makes one socket write
    where ``async for`` over the stream would make one per item, each after a loop turn.
    """
    while True:
        try:
            batch = [receive.receive_nowait()]
        except anyio.WouldBlock:
            try:
                batch = [await receive.receive()]
            except anyio.EndOfStream:
                return
        except anyio.EndOfStream:
            return
        while len(batch) < most:
            try:
                batch.append(receive.receive_nowait())
            except (anyio.WouldBlock, anyio.EndOfStream):
                break  # the end shows on the next call
        yield batch


class Wakeup:
    """A flag one task waits on, with a deadline kept by a loop timer rather than a cancel scope.

    For the hot path's waits for "something changed": ``anyio.Event`` plus ``move_on_after`` makes an
    event, a cancel scope and its timer for every wait; this makes one future and one timer entry.
    """

    __slots__ = ("_is_set", "_waiter")

    def __init__(self) -> None:
        self._is_set = False
        self._waiter: asyncio.Future[None] | None = None

    def set(self) -> None:
        """Wake the waiter (or the next one to wait)."""
        self._is_set = True
        _wake(self._waiter)

    def clear(self) -> None:
        """Forget earlier wake-ups: the next wait waits for a new one."""
        self._is_set = False

    async def wait(self, timeout: float = math.inf) -> bool:
        """Until set or ``timeout`` seconds have passed; whether it was set. One waiter at a time."""
        if not self._is_set:
            loop = asyncio.get_running_loop()
            self._waiter = waiter = loop.create_future()
            timer = loop.call_later(timeout, _wake, waiter) if timeout != math.inf else None
            try:
                await waiter
            finally:
                self._waiter = None
                if timer is not None:
                    timer.cancel()
        return self._is_set


class Mailbox(Generic[T]):
    """A bounded queue for one reader, whose waits can have a deadline without a cancel scope.

    Each request in flight on a node waits on one of these for its response frames, with the poll
    window as deadline. ``anyio.fail_after`` around a receive cost about 5 % of the node's CPU per
    request (a cancel scope, its timer, the backend looked up each time); a loop timer that wakes
    the reader costs a heap entry. Writers wait while it is full (backpressure); closing it wakes
    everyone.
    """

    def __init__(self, capacity: int) -> None:
        self._items: deque[T] = deque()
        self._capacity = capacity
        self._reader = Wakeup()
        self._writers: deque[asyncio.Future[None]] = deque()
        self.closed = False

    def __len__(self) -> int:
        return len(self._items)

    async def put(self, item: T) -> bool:
        """Queue ``item`` (waiting for room); False when the mailbox is closed."""
        while len(self._items) >= self._capacity and not self.closed:
            room = asyncio.get_running_loop().create_future()
            self._writers.append(room)
            try:
                await room
            finally:
                if room in self._writers:
                    self._writers.remove(room)
        if self.closed:
            return False
        self._items.append(item)
        self._reader.set()
        return True

    async def get(self, timeout: float = math.inf) -> T:
        """The next item; TimeoutError after ``timeout`` seconds, anyio.ClosedResourceError once closed."""
        if not self._items:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            while not self._items:
                if self.closed:
                    raise anyio.ClosedResourceError
                left = deadline - loop.time()
                if left <= 0:
                    raise TimeoutError
                self._reader.clear()
                await self._reader.wait(left)
        item = self._items.popleft()
        while self._writers:
            writer = self._writers.popleft()
            if not writer.done():  # one that gave up waiting does not take the room from the next
                writer.set_result(None)
                break
        return item

    def close(self) -> None:
        self.closed = True
        self._reader.set()
        while self._writers:
            _wake(self._writers.popleft())


def _wake(future: asyncio.Future[None] | None) -> None:
    if future is not None and not future.done():
        future.set_result(None)
