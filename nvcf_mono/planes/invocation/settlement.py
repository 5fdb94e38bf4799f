"""How the platform itself answers a request that no function will: to its caller, or to a status poll.

The answer goes to the node that holds the caller (through the relay); when that node is gone or
the caller already got a 202, the result is stored so a status poll on any node finds it.
"""

from __future__ import annotations

from typing import final

from nvcf_mono.contracts.frames import Request, problem_frame
from nvcf_mono.planes.invocation.relay import Relay
from nvcf_mono.planes.invocation.results import ResultStore


@final
class Answers:
    """Problems the platform answers in place of a function."""

    def __init__(self, relay: Relay, results: ResultStore) -> None:
        self._relay = relay
        self._results = results

    async def problem(self, request: Request, status: int, detail: str) -> None:
        """End ``request`` with a problem: its caller gets it now, or its next status poll does."""
        frame = problem_frame(request.request_id, status, detail)
        if await self._relay.send(request.reply, frame) != "ok":
            await self._results.store_problem(request.request_id, status, detail)
