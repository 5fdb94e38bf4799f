"""The nats transport: the worker pulls its version's durable itself and answers over NATS.

NVCF's own design. ConnectOnce hands the worker a NATS URL, an inbox prefix and a token the
platform's auth callout turns into permissions scoped to the session and its version
(``contracts/permissions.py``). Requests come
straight from JetStream (never more than ``MAX_REQUEST_CONCURRENCY`` unsettled), response frames go
to the node holding the client as bus requests (stop-and-wait, as the relay does on the grpc
transport), and the WorkerService stream stays open as the control channel: readiness, drain,
and the frames of requests whose node went away (the node stores those results).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import final

import anyio

from nvcf_mono.bus.api import Bus, Delivery
from nvcf_mono.bus.errors import BusError, NoResponders, RequestTimeout
from nvcf_mono.contracts import subjects
from nvcf_mono.contracts.frames import Frame, Problem, Request
from nvcf_mono.proto.serve_wire import WorkerEnvelope
from nvcf_mono.structure import evolve

log = logging.getLogger("nvcf_mono.worker.nats")
OK = b"ok"

Out = Callable[[WorkerEnvelope], Awaitable[None]]


@final
class Held:
    """One request pulled from JetStream: where its frames go, and how it is settled."""

    def __init__(
        self,
        bus: Bus,
        delivery: Delivery,
        request: Request,
        *,
        up: Out,
        max_deliver: int,
        scope: anyio.CancelScope,
        timeout: float = 60.0,
    ) -> None:
        self._bus = bus
        self.delivery = delivery
        self.request = request
        self._up = up
        self.max_deliver = max_deliver
        self._scope = scope
        self._timeout = timeout
        self.frames_sent = 0
        self.orphan = False
        self.settled = False

    @property
    def attempt(self) -> int:
        return self.delivery.num_delivered

    async def answer(self, frame: Frame) -> None:
        """Send a frame to the client's node; settle the delivery after the last one."""
        if self.settled:
            return
        if not await self._send(frame):
            await self.settle(ack=True)  # nobody to answer any more: done with it
            self._scope.cancel()
        elif frame.last:
            await self.settle(ack=True)

    async def _send(self, frame: Frame) -> bool:
        """Whether the frame reached the client's node (or, with the node gone, the platform's store)."""
        blob = frame.encode()
        self.frames_sent += 1
        if not self.orphan:
            try:
                reply = await self._bus.request(self.request.reply, blob, timeout=self._timeout)
            except NoResponders:
                self.orphan = True  # the node is gone: the platform keeps the result (via our node)
            except (RequestTimeout, BusError) as err:
                log.warning("request %s: its node does not take frames (%s); giving up", self.request.request_id, err)
                return False
            else:
                return reply.data == OK  # otherwise the client went away
        # Up the gRPC stream, with the request's capability: the node keeps only frames that carry it.
        capability = subjects.response_capability(self.request.reply)
        await self._up(WorkerEnvelope(frame=evolve(frame, capability=capability).encode()))
        return True

    async def failed(self, reason: str) -> None:
        """The request took the inference server down: another instance tries, up to max_deliver times."""
        if self.settled:
            return
        if self.frames_sent == 0 and self.attempt < self.max_deliver:
            await self.settle(ack=False)
            return
        if self.frames_sent == 0:
            await self.refuse(500, f"the request failed on {self.attempt} deliveries (last: {reason}); not retried")
        else:
            await self.refuse(502, f"the instance failed mid-response: {reason}")

    async def settle(self, *, ack: bool) -> None:
        if self.settled:
            return
        self.settled = True
        try:
            if ack:
                await self.delivery.ack()
            else:
                await self.delivery.nak()
        except BusError as err:
            log.warning("could not settle %s: %s", self.request.request_id, err)

    async def _terminate(self) -> None:
        self.settled = True
        try:
            await self.delivery.term()
        except BusError as err:
            log.warning("could not end %s: %s", self.request.request_id, err)

    async def expired(self) -> None:
        """Not started before its queue deadline: dropped, and the client told so (504)."""
        await self.refuse(504, "the request waited in the queue past its deadline")

    async def refuse(self, status: int, detail: str) -> None:
        """End the request unserved, answering the client with a problem."""
        if self.settled:
            return
        await self._terminate()
        problem = Problem(status=status, detail=detail)
        await self._send(Frame(request_id=self.request.request_id, seq=0, attempt=99, problem=problem))

    async def keep_alive(self) -> None:
        if not self.settled:
            try:
                await self.delivery.in_progress()
            except BusError as err:
                log.debug("keepalive of %s failed: %s", self.request.request_id, err)
