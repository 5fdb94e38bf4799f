"""Requests whose callers stopped waiting: the 202 that says why a request still waits, the status
polls that fetch its result once, and the retries of an idempotent request.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import final

from aiohttp import web

from nvcf_mono.auth.principal import Principal
from nvcf_mono.contracts.buckets import RequestRecord
from nvcf_mono.contracts.frames import Frame, Request
from nvcf_mono.http.problem import ProblemError
from nvcf_mono.models.common import now_iso
from nvcf_mono.models.wait_reason import wait_reason
from nvcf_mono.planes.invocation.answers import (
    OWN_RESPONSE,
    PERCENT,
    QUEUE_POSITION,
    REQID,
    STATUS,
    WAIT_REASON,
    ReplyWriter,
    head_of,
    unknown_request,
)
from nvcf_mono.planes.invocation.config import InvocationConfig
from nvcf_mono.planes.invocation.dispatch import Dispatcher
from nvcf_mono.planes.invocation.idempotency import IDEMPOTENCY_KEY, Claim, Idempotency
from nvcf_mono.planes.invocation.intake import poll_seconds
from nvcf_mono.planes.invocation.responses import Pending
from nvcf_mono.planes.invocation.results import QUEUED, ResultStore
from nvcf_mono.planes.invocation.routing import RoutingTable


@final
class Waiting:
    """202s, status polls and idempotent replays, on any node."""

    def __init__(
        self,
        *,
        config: InvocationConfig,
        routing: RoutingTable,
        dispatcher: Dispatcher,
        results: ResultStore,
        writer: ReplyWriter,
        adopt: Callable[[Pending, Request], Awaitable[None]],
        idempotency: Idempotency | None = None,
    ) -> None:
        self.config = config
        self.routing = routing
        self.dispatcher = dispatcher
        self.results = results
        self.writer = writer
        self._adopt = adopt
        self.idempotency = idempotency

    async def accepted(self, pending: Pending, req: Request, *, frame: Frame | None = None) -> web.Response:
        """202: the request stays queued or running; its result will wait for a status poll."""
        pending.detached = True
        ttl = self.config.queue_deadline + self.config.result_ttl
        await self.results.track(
            RequestRecord(
                request_id=req.request_id,
                function_id=req.function_id,
                function_version_id=req.function_version_id,
                nca_id=req.nca_id,
                region=self.dispatcher.region,
                state=QUEUED,
                created_at=now_iso(),
            ),
            ttl=ttl,
        )
        await self._adopt(pending, req)
        headers = await self.wait_headers(req.request_id, req.function_version_id)
        if frame is not None:
            if frame.percent is not None:
                headers[PERCENT] = str(frame.percent)
            kept = {k: v for k, v in frame.headers if k.lower() not in OWN_RESPONSE}
            return web.Response(status=202, headers={**kept, **headers}, body=frame.body)
        return web.Response(status=202, headers=headers)

    async def wait_headers(self, request_id: str, function_version_id: str) -> dict[str, str]:
        """``NVCF-REQID``, ``NVCF-STATUS: in-progress`` and why the request is still waiting."""
        headers = {REQID: request_id, STATUS: "in-progress"}
        state, position = await self.dispatcher.queue_state(function_version_id, request_id)
        if state == "queued":
            fv = self.routing.version_by_id(function_version_id)
            state = wait_reason(self.routing.placements_of(fv)) if fv is not None else state
        headers[WAIT_REASON] = state
        if position is not None:
            headers[QUEUE_POSITION] = str(position)
        return headers

    async def poll(
        self, request: web.Request, principal: Principal, request_id: str, *, buffered: bool = False
    ) -> web.StreamResponse:
        """A status poll: the result (once), 202 while the request runs, 404 when unknown or fetched."""
        poll = poll_seconds(self.config, request.headers, streaming=False)
        record = await self._record(principal, request_id)
        if record is None:
            taken = await self.results.take(request_id)
            if taken is None:
                raise ProblemError(404, unknown_request(request_id))
            return await self.writer.render_result(request, *taken, buffered=buffered)
        if not await self.results.wait(request_id, poll):
            return web.Response(status=202, headers=await self.wait_headers(request_id, record.function_version_id))
        taken = await self.results.take(request_id)
        if taken is None:
            raise ProblemError(404, unknown_request(request_id))
        return await self.writer.render_result(request, *taken, buffered=buffered)

    async def peek(self, principal: Principal, request_id: str) -> web.StreamResponse:
        """A status poll's head, now: the result's status and headers (the result left for a GET), 202
        while the request runs, 404 when unknown or fetched.
        """
        record = await self._record(principal, request_id)
        result = await self.results.peek(request_id)
        if result is not None:
            return head_of(result)
        if record is None:
            raise ProblemError(404, unknown_request(request_id))
        return web.Response(status=202, headers=await self.wait_headers(request_id, record.function_version_id))

    async def _record(self, principal: Principal, request_id: str) -> RequestRecord | None:
        """The request's record; 404 when it is another account's that the caller may not invoke."""
        record = await self.results.record(request_id)
        if record is not None and record.nca_id != principal.account:
            fv = self.routing.version(record.function_id, record.function_version_id)
            if fv is None or not self.routing.may_invoke(principal, fv):
                raise ProblemError(404, unknown_request(request_id))
        return record

    async def replay(
        self, request: web.Request, claim: Claim, *, poll: int, buffered: bool
    ) -> web.StreamResponse | None:
        """A retry of an idempotent request: its kept result (left for the next retry), or 202 while it runs;
        None when the key no longer names the request (it was released: the caller claims it again).
        """
        assert self.idempotency is not None
        request_id = claim.request_id
        record = await self.results.record(request_id)
        if record is not None and not await self.results.wait(request_id, poll):
            return web.Response(status=202, headers=await self.wait_headers(request_id, record.function_version_id))
        stored = await self.idempotency.stored(request_id)
        if stored is None:
            if not await self.idempotency.names(claim):
                return None
            raise ProblemError(
                409,
                f"request '{request_id}' of this {IDEMPOTENCY_KEY} has finished and its result was already "
                f"fetched or has expired; send another {IDEMPOTENCY_KEY} to invoke again",
                headers={REQID: request_id},
            )
        return await self.writer.render_result(request, *stored, buffered=buffered)
