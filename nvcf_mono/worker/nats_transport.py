"""The nats transport: the worker pulls its version's durable itself and answers over NATS.

NVCF's own design. ConnectOnce hands the worker a NATS URL, an inbox prefix and a token the
platform's auth callout turns into permissions scoped to the session and its version
(``contracts/permissions.py``). Requests come
straight from JetStream (never more than ``MAX_REQUEST_CONCURRENCY`` unsettled), response frames go
to the node holding the client as bus requests (stop-and-wait, as the relay does on the grpc
transport), and the WorkerService stream stays open as the control channel: readiness, drain,
what the worker holds (so its node hands it back at once if the worker dies), and the frames of
requests whose node went away (the node stores those results). Settling is
``nvcf_mono/settlement.py``'s, as on the node for the grpc transport.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, final

from nvcf_mono.bus.errors import BusError, NoResponders, RequestTimeout
from nvcf_mono.contracts import subjects
from nvcf_mono.contracts.frames import Frame, Request
from nvcf_mono.proto.serve_wire import WorkerEnvelope
from nvcf_mono.settlement import Outcome
from nvcf_mono.structure import evolve

if TYPE_CHECKING:
    from nvcf_mono.bus.api import Bus

log = logging.getLogger("nvcf_mono.worker.nats")
OK = b"ok"

Out = Callable[[WorkerEnvelope], Awaitable[None]]


@final
class WorkerSink:
    """A :class:`nvcf_mono.settlement.Sink` in a worker: frames straight to the caller's node over NATS;
    a response nobody takes there goes up the gRPC stream, for the worker's node to store.
    """

    def __init__(self, bus: Bus, up: Out, *, timeout: float = 60.0) -> None:
        self._bus = bus
        self._up = up
        self._timeout = timeout

    async def send(self, request: Request, frame: Frame, blob: bytes) -> Outcome:
        try:
            reply = await self._bus.request(request.reply, blob, timeout=self._timeout)
        except NoResponders:
            return "orphaned"  # the node is gone: the platform keeps the result (through our node)
        except (RequestTimeout, BusError) as err:
            log.warning("request %s: its node does not take frames (%s); giving up", request.request_id, err)
            return "gone"
        return "ok" if reply.data == OK else "gone"  # otherwise the client went away

    async def keep(self, request: Request, frames: Sequence[Frame]) -> None:
        # With the request's capability: the node keeps only frames that carry it.
        capability = subjects.response_capability(request.reply)
        for frame in frames:
            await self._up(WorkerEnvelope(frame=evolve(frame, capability=capability).encode()))
