"""Queues of versions that are no longer deployed: what waits in them is answered, then they are removed.

A version's request stream lives while the version is deployed. Once its deployment is gone
(undeployed, or the function deleted) and has stayed gone for ``grace`` (so a node that accepted a
request a moment before it heard of the undeploy has published it), each request still queued is
answered 404 (its caller's status poll gets it) and the stream is deleted with its consumer: the
store holds what is queued, never what was once deployed. A request that arrives later from a
node with a stale view recreates the stream, and the next sweep answers it the same way. Every
invocation node sweeps; the consumer hands each request to one of them, and deletes are idempotent.
"""

from __future__ import annotations

import logging
import time
from typing import final

import anyio
from anyio.abc import TaskStatus

from nvcf_mono.bus.api import Bus, Delivery
from nvcf_mono.bus.errors import BusError, NotFound
from nvcf_mono.contracts import subjects
from nvcf_mono.contracts.frames import FrameError, Request
from nvcf_mono.planes.invocation.dispatch import Dispatcher
from nvcf_mono.planes.invocation.routing import RoutingTable
from nvcf_mono.planes.invocation.settlement import NodeSink

#: How long one sweep waits for the next queued request of a retired version before it moves on.
DRAIN_STEP = 0.5
#: Retired queues handled at once. Each costs the store about eight JetStream API calls: with eight at
#: once, undeploying 2,000 versions together on a 2-core machine left key-value writes unanswered
#: (some API calls answered 503) in five runs of six; with two, none in four.
CONCURRENCY = 2


@final
class RetiredQueues:
    """Answers and removes the request queues of versions that are no longer deployed."""

    def __init__(
        self,
        bus: Bus,
        *,
        routing: RoutingTable,
        dispatcher: Dispatcher,
        answers: NodeSink,
        interval: float,
        grace: float,
        log: logging.Logger,
    ) -> None:
        self._bus = bus
        self._routing = routing
        self._dispatcher = dispatcher
        self._answers = answers
        self._interval = interval
        self._grace = grace
        self._log = log
        #: version id -> when this node first saw its queue without a deployment (monotonic)
        self._retired_since: dict[str, float] = {}
        self.removed = 0
        self.answered = 0

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Sweep every ``interval`` (a queue is due ``grace`` after its deployment went)."""
        task_status.started()
        while True:
            try:
                await self.sweep()
            except BusError as err:
                self._log.warning("sweeping the queues of undeployed versions failed: %s", err)
            await anyio.sleep(self._interval)

    def _deployed(self, version_id: str) -> bool:
        fv = self._routing.version_by_id(version_id)
        return fv is not None and self._routing.deployment(fv) is not None

    async def sweep(self) -> None:
        """One pass over this region's request streams."""
        region = self._dispatcher.region
        names = await self._bus.stream_names(subjects.request_streams_filter(region))
        now = time.monotonic()
        present, due = set(), []
        for name in names:
            version_id = subjects.version_of_request_stream(region, name)
            if version_id is None:
                continue
            present.add(version_id)
            if self._deployed(version_id):
                self._retired_since.pop(version_id, None)
                continue
            since = self._retired_since.setdefault(version_id, now)
            if now - since >= self._grace:
                due.append(version_id)
        for version_id in set(self._retired_since) - present:
            del self._retired_since[version_id]
        slots = anyio.Semaphore(CONCURRENCY)

        async def retire(version_id: str) -> None:
            async with slots:
                await self._retire(version_id)

        async with anyio.create_task_group() as tg:
            for version_id in due:
                tg.start_soon(retire, version_id)

    async def _retire(self, version_id: str) -> None:
        stream = self._bus.stream(self._dispatcher.stream_name(version_id))
        try:
            if (await stream.info()).messages:
                await self._drain(version_id)
                if (await stream.info()).messages:
                    return  # some are still held by an instance: the next sweep takes them
            await self._bus.delete_stream(stream.name)
        except NotFound:
            pass
        except BusError as err:
            self._log.warning("could not retire the request queue of version %s: %s", version_id, err)
            return
        self._dispatcher.forget(version_id)
        self._retired_since.pop(version_id, None)
        self.removed += 1
        self._log.info("removed the request queue of version %s: it is no longer deployed", version_id)

    async def _drain(self, version_id: str) -> None:
        """Answer the requests waiting in the queue (those an instance holds are left to it)."""
        await self._dispatcher.ensure(version_id, again=True)  # its consumer, to take what waits
        stream = self._bus.stream(self._dispatcher.stream_name(version_id))
        durable = self._dispatcher.durable(version_id)
        waiting = (await stream.consumer_info(durable)).num_pending
        if not waiting:
            return
        async with stream.consume(durable, batch=64, max_inflight=64, fetch_timeout=DRAIN_STEP) as consumer:
            deliveries = aiter(consumer)
            for _ in range(waiting):
                delivery: Delivery | None = None
                with anyio.move_on_after(DRAIN_STEP * 2):
                    delivery = await anext(deliveries)
                if delivery is None:
                    return
                await self._answer(version_id, delivery)

    async def _answer(self, version_id: str, delivery: Delivery) -> None:
        try:
            request = Request.decode(delivery.data)
        except FrameError as err:
            self._log.error("dropping a malformed request in %s: %s", delivery.subject, err)
            await delivery.term()
            return
        await self._answers.answer(
            request,
            404,
            f"function version '{version_id}' was undeployed before this request ran; it was not run",
        )
        await delivery.ack()
        await self._dispatcher.drop_body(request.body_object)
        self.answered += 1
