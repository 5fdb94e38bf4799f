"""Requests that answered 202 on this node: keep listening, and store the result when it comes."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from typing import final

import anyio
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectSendStream

from nvcf_mono.bus.errors import BusError
from nvcf_mono.contracts.frames import Frame, Request
from nvcf_mono.planes.invocation.dispatch import Dispatcher
from nvcf_mono.planes.invocation.responses import Pending, ResponseRouter
from nvcf_mono.planes.invocation.results import ResultStore


@final
class Collector:
    """One task per detached request, in the plugin's task group (none outlives the plugin)."""

    def __init__(
        self, *, router: ResponseRouter, results: ResultStore, dispatcher: Dispatcher, log: logging.Logger
    ) -> None:
        self._router = router
        self._results = results
        self._dispatcher = dispatcher
        self._log = log
        #: Open while :meth:`run` runs. Made there, not here: a plugin stopped before it ran leaves no
        #: stream unclosed behind it.
        self._send: MemoryObjectSendStream[tuple[Pending, Request]] | None = None

    async def adopt(self, pending: Pending, request: Request) -> None:
        if self._send is None:
            raise anyio.ClosedResourceError  # not running: as the closed stream of a stopped one would
        await self._send.send((pending, request))

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        send, receive = anyio.create_memory_object_stream[tuple[Pending, Request]](10_000)
        self._send = send
        try:
            async with send, anyio.create_task_group() as tg:
                task_status.started()
                async with receive:
                    async for pending, request in receive:
                        tg.start_soon(self._collect, pending, request)
        finally:
            self._send = None

    async def _collect(self, pending: Pending, request: Request) -> None:
        rid = request.request_id
        try:
            remaining = request.deadline_ms / 1000 - time.time()
            try:
                first = await self._next_result(pending, max(remaining, 0.0) + 5)
            except TimeoutError:
                await self._dispatcher.cancel(request.function_version_id, rid, reason="queue deadline")
                await self._results.store_problem(
                    rid, 504, "no instance answered the request before its queue deadline; it was dropped"
                )
                return

            async def rest() -> AsyncIterator[Frame]:
                while True:
                    yield await pending.next(timeout=self._dispatcher_timeout(request))

            await self._results.store_frames(first, rest())
        except BusError as err:
            self._log.error("could not store the result of %s: %s", rid, err)
        except TimeoutError:
            await self._results.store_problem(rid, 502, "the response stopped arriving before it was complete")
        finally:
            self._router.forget(rid)
            await self._dispatcher.drop_body(request.body_object)

    async def _next_result(self, pending: Pending, timeout: float) -> Frame:
        """The first frame of the result; progress reports before it are kept for status polls."""
        with anyio.fail_after(timeout):
            while True:
                frame = await pending.next()
                if not (frame.status == 202 and frame.percent is not None and not frame.last):
                    return frame
                try:
                    await self._results.progress(frame)
                except BusError as err:
                    self._log.warning("could not keep the progress of %s: %s", frame.request_id, err)

    @staticmethod
    def _dispatcher_timeout(request: Request) -> float:
        return max(request.deadline_ms / 1000 - time.time(), 0.0) + 600
