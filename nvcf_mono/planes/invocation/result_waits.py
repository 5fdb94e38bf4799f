"""Status polls waiting for a result: one subscription per node on the results bucket, fanned out here.

A waiting poll registers its request id; every write to the bucket reaches this node's single
core subscription on ``$KV.<bucket>.>`` and wakes the polls of that key, which then read the
result. NATS's cost is one subscription per node however many callers wait (a KV watch per poll
was an ordered consumer each, which outlived its watch and ran the results stream into its
consumer limit under polling load). A write lost to a slow subscriber or a reconnect costs a
waiter at most ``recheck`` seconds: each looks again on its own that often.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import final

import anyio
from anyio.abc import TaskStatus

from nvcf_mono.bus.api import Bus
from nvcf_mono.bus.errors import BusError

#: How often a waiter looks for its result without having been woken (a missed wake's cost).
RECHECK = 5.0
#: A write's notice can arrive before its stream has stored it: looks again after these pauses.
SETTLE = (0.002, 0.01, 0.03, 0.1, 0.3)


@final
class ResultWaits:
    """Wakes the polls waiting for a key of one bucket."""

    def __init__(self, bus: Bus, bucket: str, log: logging.Logger, *, recheck: float = RECHECK) -> None:
        self._bus = bus
        self._prefix = f"$KV.{bucket}."
        self._log = log
        self._recheck = recheck
        self._waiting: dict[str, set[anyio.Event]] = {}
        self.running = False

    def __len__(self) -> int:
        return sum(len(events) for events in self._waiting.values())

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Hold the subscription until cancelled (re-subscribing after a bus error)."""
        started = False
        while True:
            try:
                async with self._bus.subscribe(self._prefix + ">", max_pending=65536) as sub:
                    self.running = True
                    if not started:
                        started = True
                        task_status.started()
                    self._wake_all()  # whatever was written while we were not subscribed
                    async for msg in sub:
                        self._wake(msg.subject[len(self._prefix) :])
            except BusError as err:
                self._log.warning("result notifications stopped (%s); polls fall back to rechecks", err)
            finally:
                self.running = False
            if not started:
                started = True
                task_status.started()
            await anyio.sleep(1.0)

    def _wake(self, key: str) -> None:
        for event in self._waiting.get(key, ()):
            event.set()

    def _wake_all(self) -> None:
        for events in self._waiting.values():
            for event in events:
                event.set()

    async def wait(self, key: str, timeout: float, present: Callable[[], Awaitable[bool]]) -> bool:
        """Wait up to ``timeout`` until ``present()`` says the key's result is there."""
        with anyio.move_on_after(timeout):
            while True:
                event = anyio.Event()
                events = self._waiting.setdefault(key, set())
                events.add(event)  # registered before looking: a write after the look still wakes us
                try:
                    if await present():
                        return True
                    with anyio.move_on_after(self._recheck):
                        await event.wait()
                    if event.is_set() and await _stored_soon(present):
                        return True
                finally:
                    events.discard(event)
                    if not events:
                        self._waiting.pop(key, None)
        return False


async def _stored_soon(present: Callable[[], Awaitable[bool]]) -> bool:
    """After a wake: the write is stored within moments of its notice (a delete is never found)."""
    for pause in SETTLE:
        await anyio.sleep(pause)
        if await present():
            return True
    return False
