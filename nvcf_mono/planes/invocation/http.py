"""NVCF's HTTP invocation: pexec (pass-through), status polling, and the wait that turns into a 202.

A request is published to its version's durable buffer and the client waits up to
``NVCF-POLL-SECONDS`` for the response head. A response that starts in time is streamed through
as the worker produces it; otherwise the client gets ``202`` with ``NVCF-REQID`` and the request
stays queued or running, its result kept for a status poll on any node. A client that hangs up
before it got a 202 cancels its request.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import final

from aiohttp import web
from multidict import CIMultiDict

from nvcf_mono.auth import scopes as S
from nvcf_mono.auth.principal import Principal
from nvcf_mono.contracts.buckets import RequestRecord
from nvcf_mono.contracts.frames import Frame, Request
from nvcf_mono.http.api import ApiRouter, Call, Param
from nvcf_mono.http.problem import PROBLEM_CONTENT_TYPE, ProblemError, problem_body
from nvcf_mono.models.common import now_iso
from nvcf_mono.models.function import FunctionVersion
from nvcf_mono.planes.invocation.config import InvocationConfig
from nvcf_mono.planes.invocation.dispatch import Dispatcher
from nvcf_mono.planes.invocation.ratelimit import RateLimiter
from nvcf_mono.planes.invocation.responses import Pending, ResponseRouter
from nvcf_mono.planes.invocation.results import QUEUED, ResultStore
from nvcf_mono.planes.invocation.routing import RoutingTable

TAG = "invocation"
REQID = "NVCF-REQID"
STATUS = "NVCF-STATUS"
PERCENT = "NVCF-PERCENT-COMPLETE"
POLL = "NVCF-POLL-SECONDS"
WAIT_REASON = "NVCF-WAIT-REASON"
QUEUE_POSITION = "NVCF-QUEUE-POSITION"
#: Never forwarded to the function (hop-by-hop, or the caller's credential).
DROPPED = frozenset(
    h.lower()
    for h in (
        "Authorization", "Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
        "Proxy-Authorization", "TE", "Trailer", "Transfer-Encoding", "Upgrade", "Host", "Content-Length",
        "NVCF-POLL-SECONDS",
    )
)  # fmt: skip
#: Response headers the node sets itself.
OWN_RESPONSE = frozenset(
    {"content-length", "transfer-encoding", "connection", "keep-alive", "nvcf-reqid", "nvcf-status"}
)


def nvcf_status(status: int) -> str:
    """``in-progress`` (202), ``fulfilled`` (other 2xx/3xx), ``errored``."""
    if status == 202:
        return "in-progress"
    return "fulfilled" if 200 <= status < 400 else "errored"


class ResponseBroken(Exception):
    """The response cannot be completed; the connection is reset rather than a body truncated."""


@final
class Invoker:
    """Everything pexec, exec and status share."""

    def __init__(
        self,
        *,
        config: InvocationConfig,
        routing: RoutingTable,
        dispatcher: Dispatcher,
        router: ResponseRouter,
        results: ResultStore,
        adopt: Callable[[Pending, Request], Awaitable[None]],
        limiter: RateLimiter,
        log: logging.Logger,
    ) -> None:
        self.config = config
        self.routing = routing
        self.dispatcher = dispatcher
        self.router = router
        self.results = results
        self._adopt = adopt
        self.limiter = limiter
        self.log = log

    def poll_seconds(self, headers: Mapping[str, str], *, streaming: bool) -> int:
        raw = headers.get(POLL)
        if raw is None or raw.strip() == "":
            return self.config.streaming_poll_seconds if streaming else self.config.default_poll_seconds
        try:
            value = int(raw.strip())
        except ValueError:
            raise ProblemError(400, f"{POLL} must be a whole number of seconds, got {raw!r}") from None
        if value > self.config.max_poll_seconds:
            raise ProblemError(400, f"{POLL} must be <= {self.config.max_poll_seconds}")
        return max(value, 1)

    async def read_body(self, request: web.Request, request_id: str) -> tuple[bytes, str | None, int]:
        """Small bodies inline; the rest streamed into the object store."""
        limit = self.config.inline_body_limit
        head = bytearray()
        content = request.content
        while len(head) <= limit:
            chunk = await content.read(limit + 1 - len(head))
            if not chunk:
                return bytes(head), None, len(head)
            head.extend(chunk)
        maximum = self.config.max_request_body

        async def rest() -> AsyncIterator[bytes]:
            size = len(head)
            yield bytes(head)
            async for chunk in content.iter_chunked(1024 * 1024):
                size += len(chunk)
                if size > maximum:
                    raise ProblemError(413, f"the request body exceeds the limit of {maximum} bytes")
                yield chunk

        name, size = await self.dispatcher.put_body(request_id, rest())
        return b"", name, size

    async def invoke(
        self,
        request: web.Request,
        principal: Principal,
        fv: FunctionVersion,
        *,
        method: str,
        path: str,
        headers: Mapping[str, str],
        asset_ids: tuple[str, ...] = (),
    ) -> web.StreamResponse:
        started = time.perf_counter()
        await self.limiter.admit(principal, fv)
        streaming = headers.get("Accept", "").strip() == "text/event-stream"
        poll = self.poll_seconds(headers, streaming=streaming)
        request_id = str(uuid.uuid4())
        body, body_object, size = await self.read_body(request, request_id)
        now_ms = int(time.time() * 1000)
        req = Request(
            request_id=request_id,
            nca_id=fv.nca_id,
            function_id=fv.id,
            function_version_id=fv.version_id,
            function_name=fv.name,
            method=method,
            path=path,
            headers=tuple((k, v) for k, v in headers.items() if k.lower() not in DROPPED),
            reply=self.router.reply_subject(request_id),
            time_ms=now_ms,
            deadline_ms=now_ms + int(self.config.queue_deadline * 1000),
            poll_seconds=poll,
            body=body,
            body_object=body_object,
            body_size=size,
            client_subject=principal.subject,
            streaming=streaming,
            asset_ids=asset_ids,
        )
        pending = self.router.register(request_id, fv.version_id)
        try:
            await self.dispatcher.publish(req)
            queued = time.perf_counter()
            return await self.respond(request, pending, req, poll=poll, started=started, queued=queued)
        except BaseException:
            if not pending.detached:
                await self.dispatcher.cancel(fv.version_id, request_id, reason="the client went away")
            raise
        finally:
            if not pending.detached:
                self.router.forget(request_id)

    async def respond(
        self, request: web.Request, pending: Pending, req: Request, *, poll: int, started: float, queued: float
    ) -> web.StreamResponse:
        try:
            first = await pending.next(timeout=poll)
        except TimeoutError:
            return await self.accepted(pending, req)
        head_at = time.perf_counter()
        if first.problem is not None:
            return problem(first.problem.status, first.problem.detail, req.request_id, instance=request.path)
        if first.status == 202:
            # The worker's progress report: the client polls for the rest.
            response = await self.accepted(pending, req, frame=first)
            return response
        timing = f"queue;dur={(queued - started) * 1000:.2f}, execution;dur={(head_at - queued) * 1000:.2f}"
        return await self.stream(request, pending, first, extra={"Server-Timing": timing})

    async def stream(
        self, request: web.Request, pending: Pending, first: Frame, *, extra: Mapping[str, str]
    ) -> web.StreamResponse:
        status = first.status or 200
        headers = CIMultiDict((k, v) for k, v in first.headers if k.lower() not in OWN_RESPONSE)
        headers[REQID] = first.request_id
        headers[STATUS] = nvcf_status(status)
        headers.update(extra)
        length = next((v for k, v in first.headers if k.lower() == "content-length"), None)
        if first.last and first.problem is None:
            return web.Response(status=status, headers=headers, body=first.body)
        response = web.StreamResponse(status=status, headers=headers)
        if length is not None and length.isdigit():
            response.content_length = int(length)
        await response.prepare(request)
        written = 0
        frame = first
        expected = first.seq
        try:
            while True:
                if frame.seq != expected or frame.attempt != first.attempt:
                    raise ResponseBroken(f"frame {frame.seq} (attempt {frame.attempt}) where {expected} was due")
                if frame.problem is not None:
                    raise ResponseBroken(f"the response broke off: {frame.problem.detail}")
                if frame.body:
                    await response.write(frame.body)
                    written += len(frame.body)
                if frame.end:
                    if frame.total_length is not None and frame.total_length != written:
                        raise ResponseBroken(f"{written} bytes arrived of {frame.total_length}")
                    break
                expected += 1
                frame = await pending.next(timeout=self.config.queue_deadline)
        except (ResponseBroken, TimeoutError) as err:
            self.log.warning("aborting the response to %s: %s", first.request_id, err)
            transport = request.transport
            if transport is not None:
                transport.abort()  # a reset, never a silently truncated body
            return response
        await response.write_eof()
        return response

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
        headers = {REQID: req.request_id, STATUS: "in-progress"}
        state, position = await self.dispatcher.queue_state(req.function_version_id, req.request_id)
        headers[WAIT_REASON] = state
        if position is not None:
            headers[QUEUE_POSITION] = str(position)
        if frame is not None:
            if frame.percent is not None:
                headers[PERCENT] = str(frame.percent)
            kept = {k: v for k, v in frame.headers if k.lower() not in OWN_RESPONSE}
            return web.Response(status=202, headers={**kept, **headers}, body=frame.body)
        return web.Response(status=202, headers=headers)


def problem(status: int, detail: str, request_id: str, *, instance: str | None = None) -> web.Response:
    """A problem+json answer carrying the request id."""
    return web.Response(
        status=status,
        body=json.dumps(problem_body(status, detail, instance=instance)).encode(),
        content_type=PROBLEM_CONTENT_TYPE,
        headers={REQID: request_id, STATUS: nvcf_status(status)},
    )


def register(router: ApiRouter, invoker_of: Callable[[], Invoker]) -> None:
    """Pexec and status (exec and Host routing live in their own module)."""
    poll_param = Param(
        name=POLL, location="header", description="Seconds to wait for the response before a 202 (1-3600).",
        schema={"type": "integer"},
    )  # fmt: skip

    async def pexec(call: Call[None], version_id: str | None) -> web.StreamResponse:
        invoker = invoker_of()
        fv = invoker.routing.resolve(call.principal, call.path("functionId"), version_id)
        return await invoker.invoke(
            call.request,
            call.principal,
            fv,
            method="POST",
            path=fv.inference_url or "/",
            headers=call.request.headers,
        )

    @router.route(
        "POST",
        "/v2/nvcf/pexec/functions/{functionId}",
        summary="Invoke any ACTIVE version of a function; the body and status pass through.",
        tag=TAG,
        scopes=(S.INVOKE_FUNCTION,),
        raw_body="*/*",
        raw_response="*/*",
        passthrough=True,
        params=(poll_param,),
        errors=(404, 413, 429),
    )
    async def invoke_function(call: Call[None]) -> web.StreamResponse:
        return await pexec(call, None)

    @router.route(
        "POST",
        "/v2/nvcf/pexec/functions/{functionId}/versions/{versionId}",
        summary="Invoke one version of a function; the body and status pass through.",
        tag=TAG,
        scopes=(S.INVOKE_FUNCTION,),
        raw_body="*/*",
        raw_response="*/*",
        passthrough=True,
        params=(poll_param,),
        errors=(404, 413, 429),
    )
    async def invoke_function_version(call: Call[None]) -> web.StreamResponse:
        return await pexec(call, call.path("versionId"))

    @router.route(
        "GET",
        "/v2/nvcf/pexec/status/{requestId}",
        summary="Poll a request that answered 202: its result (once), 202 while it runs, 404 when unknown.",
        tag=TAG,
        scopes=(S.INVOKE_FUNCTION,),
        raw_response="*/*",
        passthrough=True,
        params=(poll_param,),
        errors=(404,),
    )
    async def get_request_status(call: Call[None]) -> web.StreamResponse:
        return await status_poll(invoker_of(), call)


async def status_poll(invoker: Invoker, call: Call[None]) -> web.StreamResponse:
    request_id = call.path("requestId")
    record = await invoker.results.record(request_id)
    if record is None:
        taken = await invoker.results.take(request_id)
        if taken is None:
            raise ProblemError(404, f"request '{request_id}' not found (unknown, or its result was already fetched)")
    elif record.nca_id != call.principal.account:
        fv = invoker.routing.version(record.function_id, record.function_version_id)
        if fv is None or not invoker.routing.may_invoke(call.principal, fv):
            raise ProblemError(404, f"request '{request_id}' not found (unknown, or its result was already fetched)")
    poll = invoker.poll_seconds(call.request.headers, streaming=False)
    if record is not None and not await invoker.results.wait(request_id, poll):
        waiting = {REQID: request_id, STATUS: "in-progress"}
        state, position = await invoker.dispatcher.queue_state(record.function_version_id, request_id)
        waiting[WAIT_REASON] = state
        if position is not None:
            waiting[QUEUE_POSITION] = str(position)
        return web.Response(status=202, headers=waiting)
    taken = await invoker.results.take(request_id)
    if taken is None:
        raise ProblemError(404, f"request '{request_id}' not found (unknown, or its result was already fetched)")
    result, body = taken
    headers = CIMultiDict((k, v) for k, v in result.headers if k.lower() not in OWN_RESPONSE)
    headers[REQID] = request_id
    headers[STATUS] = nvcf_status(result.status)
    if result.percent is not None:
        headers[PERCENT] = str(result.percent)
    if isinstance(body, bytes):
        return web.Response(status=result.status, headers=headers, body=body)
    response = web.StreamResponse(status=result.status, headers=headers)
    response.content_length = result.body_size
    await response.prepare(call.request)
    async for chunk in body:
        await response.write(chunk)
    await response.write_eof()
    return response
