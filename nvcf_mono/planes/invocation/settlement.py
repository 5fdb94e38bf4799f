"""Where the frames of requests this node settles go (``nvcf_mono/settlement.py``), and answers it gives itself.

Frames go to the node that holds the caller (through the relay: directly when that is this node);
a response nobody takes any more (that node went away, or the caller had a 202) is stored so a
status poll on any node finds it, and the request's stored body goes with it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import final

from nvcf_mono.contracts.frames import Frame, Request, problem_frame
from nvcf_mono.planes.invocation.dispatch import Dispatcher
from nvcf_mono.planes.invocation.relay import Relay
from nvcf_mono.planes.invocation.results import ResultStore
from nvcf_mono.settlement import Outcome


@final
class NodeSink:
    """A :class:`nvcf_mono.settlement.Sink` on an invocation node."""

    def __init__(self, relay: Relay, results: ResultStore, dispatcher: Dispatcher) -> None:
        self._relay = relay
        self._results = results
        self._dispatcher = dispatcher

    async def send(self, request: Request, frame: Frame, blob: bytes) -> Outcome:
        return await self._relay.send(request.reply, frame, blob)

    async def input(self, request: Request, offset: int) -> bytes:
        """A live gRPC call's client stream from ``offset``, for the worker serving it here."""
        return await self._relay.input(request, offset)

    async def keep(self, request: Request, frames: Sequence[Frame]) -> None:
        await self.store(frames)
        await self._dispatcher.drop_body(request.body_object)

    async def store(self, frames: Sequence[Frame]) -> None:
        """Store a response given as frames (the first one seq 0) as its request's result."""

        async def rest() -> AsyncIterator[Frame]:
            for frame in frames[1:]:
                yield frame

        await self._results.store_frames(frames[0], rest())

    async def answer(self, request: Request, status: int, detail: str) -> None:
        """End ``request`` with the platform's own problem: its caller gets it now, or its next status poll."""
        frame = problem_frame(request.request_id, status, detail)
        if await self.send(request, frame, frame.encode()) != "ok":
            await self.keep(request, [frame])
