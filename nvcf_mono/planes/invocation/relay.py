"""Frames from a worker on their way to the node that holds the client.

Stop-and-wait per request: a frame is answered before the next is sent (see responses.py). When
the holding node is gone (no responders), the relay keeps the response itself: it collects the
rest of the frames and stores the result, so a client that got a 202 still finds it by polling.
"""

from __future__ import annotations

import logging
from typing import final

from nvcf_mono.bus.api import Bus
from nvcf_mono.bus.errors import BusError, NoResponders, RequestTimeout
from nvcf_mono.contracts import live_input, subjects
from nvcf_mono.contracts.frames import Frame, Request
from nvcf_mono.planes.invocation.responses import OK, ResponseRouter
from nvcf_mono.settlement import Outcome


@final
class Relay:
    """Sends frames to their receiver (on this node directly, else over the bus)."""

    def __init__(self, bus: Bus, router: ResponseRouter, log: logging.Logger, *, timeout: float = 60.0) -> None:
        self._bus = bus
        self._router = router
        self._log = log
        self._timeout = timeout

    async def send(self, reply: str, frame: Frame, blob: bytes | None = None) -> Outcome:
        """``ok``; ``gone`` (the client left: stop); ``orphaned`` (nobody holds the request any more)."""
        if self._router.is_local(reply):
            return "ok" if await self._router.deliver(frame) == "ok" else "gone"
        try:
            answer = await self._bus.request(reply, blob if blob is not None else frame.encode(), timeout=self._timeout)
        except NoResponders:
            return "orphaned"
        except RequestTimeout:
            self._log.warning("the receiver of %s did not take a frame for %gs", frame.request_id, self._timeout)
            return "gone"
        except BusError as err:
            self._log.warning("cannot relay a frame of %s: %s", frame.request_id, err)
            return "orphaned"
        return "ok" if answer.data == OK else "gone"

    async def input(self, request: Request, offset: int) -> bytes:
        """A live call's client stream from ``offset`` (contracts/live_input.py), from this node directly
        when its client is here.
        """
        if self._router.is_local(request.reply):
            return await self._router.read_input(request.request_id, offset)
        return await live_input.fetch(self._bus, subjects.input_subject(request.reply), offset)
