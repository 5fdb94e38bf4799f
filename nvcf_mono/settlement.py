"""How a delivered request ends: its response frames relayed, then exactly one ack, nak or term.

One piece of code for both worker transports. On the grpc transport the invocation node holds each
delivery for the worker it streams requests to; on the nats transport the worker pulls and holds
its deliveries itself. Either way, a held request

- is refused before it runs when it waited past its queue deadline (504), or was delivered more
  often than the platform allows without an answer (500): ended (term), its caller told why;
- relays each response frame to the node that holds its caller, and is acked after the last one;
- when that node is gone, keeps the frames and hands the whole response over to be stored (a status
  poll on any node finds it); a response already under way when its node went is stored as a 502;
- when its caller is gone, is acked (nobody wants it) and whoever serves it is told to stop;
- when serving failed before any frame, is handed back (nak) for another instance while
  ``max_deliver`` allows, else ended with a 500; after frames were sent, ended with a 502;
- is kept alive (in progress) while it runs.

What differs between the transports is where frames go (:class:`Sink`): the node relays them
itself and stores what nobody takes; a worker sends them to the node over NATS and hands what
nobody takes up its gRPC stream, for its node to store.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal, Protocol, final

import attrs

from nvcf_mono.bus.errors import BusError
from nvcf_mono.contracts import redelivery
from nvcf_mono.contracts.frames import Frame, Request, problem_frame

if TYPE_CHECKING:
    from nvcf_mono.bus.api import Delivery

Outcome = Literal["ok", "gone", "orphaned"]

log = logging.getLogger("nvcf_mono.settlement")

EXPIRED = "the request waited in the queue past its deadline"
BROKEN_OFF = "the invocation node holding this request went away mid-response"


class Sink(Protocol):
    """Where a held request's frames go."""

    async def send(self, request: Request, frame: Frame, blob: bytes) -> Outcome:
        """Hand a frame to the node holding the caller: ``ok``, ``gone`` (the caller left) or ``orphaned``."""
        ...

    async def keep(self, request: Request, frames: Sequence[Frame]) -> None:
        """Store the response of a request whose caller's node went away, for a status poll."""
        ...


@final
@attrs.frozen
class Policy:
    """The retry rule: deliveries a request may fail before its caller gets a 500 instead."""

    max_deliver: int


@final
class Settlement:
    """One delivery of one request, from its arrival to its single ack, nak or term."""

    def __init__(self, delivery: Delivery, request: Request, *, policy: Policy, sink: Sink) -> None:
        self.delivery = delivery
        self.request = request
        self._policy = policy
        self._sink = sink
        #: Frames relayed so far (0: nobody has answered yet).
        self.frames = 0
        #: The caller's node went away: the response is collected here and stored at its end.
        self._orphan: list[Frame] | None = None
        self.settled = False

    @property
    def attempt(self) -> int:
        return self.delivery.num_delivered

    # ---- arrival -----------------------------------------------------------------------------------

    async def refused_on_arrival(self) -> bool:
        """End it unserved if it is past its deadline or its deliveries (True: do not serve it)."""
        if redelivery.given_up(self.attempt, self._policy.max_deliver):
            await self.refuse(500, redelivery.given_up_detail(self.attempt))
            return True
        if self.request.deadline_ms and self.request.deadline_ms < time.time() * 1000:
            await self.refuse(504, EXPIRED)
            return True
        return False

    # ---- the response ------------------------------------------------------------------------------

    async def relay(self, frame: Frame, blob: bytes | None = None) -> bool:
        """Pass a frame on (acked after the last); False when nobody wants the rest: stop serving it."""
        if self.settled:
            return False
        self.frames += 1
        if self._orphan is not None:
            self._orphan.append(frame)
        else:
            outcome = await self._sink.send(self.request, frame, blob if blob is not None else frame.encode())
            if outcome == "gone":
                await self._settle("ack")  # the caller left: done with it
                return False
            if outcome == "orphaned":
                if frame.seq != 0:
                    await self._settle("ack")
                    await self._keep([problem_frame(self.request.request_id, 502, BROKEN_OFF)])
                    return False
                self._orphan = [frame]
        if frame.last:
            await self._settle("ack")
            if self._orphan is not None:
                await self._keep(self._orphan)
        return True

    async def _keep(self, frames: Sequence[Frame]) -> None:
        try:
            await self._sink.keep(self.request, frames)
        except BusError as err:
            log.error("could not keep the response of %s: %s", self.request.request_id, err)

    # ---- other endings -----------------------------------------------------------------------------

    async def failed(self, reason: str) -> None:
        """Serving it failed (the inference server died, the worker went away)."""
        if self.settled:
            return
        if self.frames == 0 and self.attempt < self._policy.max_deliver:
            await self._settle("nak")  # another instance tries
        elif self.frames == 0:
            await self.refuse(500, f"the request failed on {self.attempt} deliveries (last: {reason}); not retried")
        else:
            await self.refuse(502, f"the instance failed mid-response: {reason}")

    async def cancelled(self) -> None:
        """Its caller cancelled it: nobody wants an answer."""
        await self._settle("ack")

    async def give_back(self) -> None:
        """Not served here after all (paused, draining, interrupted): another instance takes it now."""
        await self._settle("nak")

    async def refuse(self, status: int, detail: str) -> None:
        """End it unserved and tell its caller why (a problem+json answer)."""
        if self.settled:
            return
        await self._settle("term")
        frame = problem_frame(self.request.request_id, status, detail)
        if self._orphan is not None or await self._sink.send(self.request, frame, frame.encode()) != "ok":
            await self._keep([frame])

    async def keep_alive(self) -> None:
        """Still being served: restart its ack-wait timer."""
        if not self.settled:
            try:
                await self.delivery.in_progress()
            except BusError as err:
                log.debug("keepalive of %s failed: %s", self.request.request_id, err)

    async def _settle(self, how: Literal["ack", "nak", "term"]) -> None:
        if self.settled:
            return
        self.settled = True
        try:
            if how == "ack":
                await self.delivery.ack()
            elif how == "nak":
                await self.delivery.nak()
            else:
                await self.delivery.term()
        except BusError as err:
            log.warning("could not %s %s: %s", how, self.request.request_id, err)
