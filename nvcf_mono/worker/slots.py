"""Serving tasks that outlive one request: a request goes to a task already waiting when there is one.

Starting a task costs more than waking one: anyio 4.14 and later give every task a handle with its
own cancel scope and event, about 65 µs of CPU per request on a slow 2-vCPU machine, where handing
the request to a waiting task costs about 15. Tasks start as the work in flight needs them, in the
session's task group (a request still ends with its session), and wait for the next request once
theirs is done; no more than ``spare`` wait at once, so what a burst started goes away after it.

Every request handed over runs, even when its session ends at that moment: its own clean-up (the
in-flight count, its directories, giving a held delivery back) is in the request's code, so it must
start.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable
from typing import final

from anyio.abc import TaskGroup

Job = Callable[[], Awaitable[None]]


@final
class Slots:
    """Runs each job handed over in a task of ``tg``: the one that waited last, else a new one."""

    def __init__(self, tg: TaskGroup, *, spare: int) -> None:
        self._tg = tg
        self._spare = spare
        #: One future per waiting task; a job is handed over as its result.
        self._waiting: deque[asyncio.Future[Job]] = deque()

    @property
    def waiting(self) -> int:
        """Tasks waiting for a job."""
        return len(self._waiting)

    def hand(self, job: Job) -> None:
        """Run ``job`` concurrently with every other job handed over (never waits)."""
        while self._waiting:
            waiter = self._waiting.pop()  # the task that waited last: its memory is still warm
            if not waiter.done():  # done: its task was cancelled while waiting
                waiter.set_result(job)
                return
        self._tg.start_soon(self._serve, job)

    async def _serve(self, job: Job) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await job()
            if len(self._waiting) >= self._spare:
                return
            waiter: asyncio.Future[Job] = loop.create_future()
            self._waiting.append(waiter)
            try:
                job = await waiter
            except BaseException:
                with contextlib.suppress(ValueError):
                    self._waiting.remove(waiter)
                if waiter.done() and not waiter.cancelled():
                    await waiter.result()()  # handed over as the session ended: it runs to its clean-up
                raise
