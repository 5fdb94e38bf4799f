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
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import final

import anyio
import attrs
from aiohttp import web
from multidict import CIMultiDict

from nvcf_mono.auth import scopes as S
from nvcf_mono.auth.principal import Principal
from nvcf_mono.bus.errors import BusError
from nvcf_mono.contracts.buckets import RequestRecord, StoredResult
from nvcf_mono.contracts.frames import Frame, Request
from nvcf_mono.http.api import Call, Param, Routes
from nvcf_mono.http.problem import PROBLEM_CONTENT_TYPE, ProblemError, problem_body
from nvcf_mono.late import Late
from nvcf_mono.models.common import now_iso
from nvcf_mono.models.function import FunctionVersion
from nvcf_mono.planes.invocation.config import InvocationConfig
from nvcf_mono.planes.invocation.dispatch import Dispatcher
from nvcf_mono.planes.invocation.idempotency import IDEMPOTENCY_KEY, Idempotency
from nvcf_mono.planes.invocation.input_assets import ASSET_REFERENCES, InputAssets, parse_references
from nvcf_mono.planes.invocation.intake import Body, new_request, stage
from nvcf_mono.planes.invocation.metrics import Entry, InvocationMetrics, Observation
from nvcf_mono.planes.invocation.ratelimit import RateLimiter
from nvcf_mono.planes.invocation.responses import Pending, ResponseRouter
from nvcf_mono.planes.invocation.results import QUEUED, ResultStore
from nvcf_mono.planes.invocation.routing import RoutingTable
from nvcf_mono.planes.invocation.wait_reason import wait_reason

TAG = "invocation"
#: Pexec and its status poll (exec and Host routing live in their own modules).
routes: Routes[Late[Invoker]] = Routes()
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
#: Largest response collected whole instead of streamed (exec's JSON wrapper).
BUFFER_LIMIT = 32 * 1024 * 1024
#: Largest response of an idempotent request kept for its retries.
KEEP_LIMIT = 8 * 1024 * 1024


def wants_stream(headers: Mapping[str, str]) -> bool:
    """The client accepts exactly ``text/event-stream`` (a longer default wait; no transforms)."""
    return headers.get("Accept", "").strip() == "text/event-stream"


def nvcf_status(status: int) -> str:
    """``in-progress`` (202), ``fulfilled`` (other 2xx/3xx), ``errored``."""
    if status == 202:
        return "in-progress"
    return "fulfilled" if 200 <= status < 400 else "errored"


class ResponseBroken(Exception):
    """The response cannot be completed; the connection is reset rather than a body truncated."""


@attrs.frozen
class Invocation:
    """What an entry point asks to invoke: the call to make on the function, and how to answer."""

    method: str
    path: str
    headers: Mapping[str, str]
    asset_ids: tuple[str, ...] = ()
    #: Seconds to wait for the response head before a 202 (None: from the headers).
    poll: int | None = None
    #: The body when the entry point has it (exec's ``requestBody``); None: read from the request.
    body: bytes | None = None
    #: Answer with the whole response (exec wraps it), not streamed through.
    buffered: bool = False


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
        assets: InputAssets | None = None,
        idempotency: Idempotency | None = None,
        metrics: InvocationMetrics | None = None,
    ) -> None:
        self.config = config
        self.routing = routing
        self.dispatcher = dispatcher
        self.router = router
        self.results = results
        self._adopt = adopt
        self.limiter = limiter
        self.log = log
        self.assets = assets
        self.idempotency = idempotency
        self.metrics = metrics

    def poll_seconds(self, headers: Mapping[str, str], *, streaming: bool) -> int:
        raw = headers.get(POLL)
        if raw is None or raw.strip() == "":
            return self.config.streaming_poll_seconds if streaming else self.config.default_poll_seconds
        try:
            value = int(raw.strip())
        except ValueError:
            raise ProblemError(400, f"{POLL} must be a whole number of seconds, got {raw[:64]!r}") from None
        if value > self.config.max_poll_seconds:
            raise ProblemError(400, f"{POLL} must be <= {self.config.max_poll_seconds}")
        if value < 0:
            # NVCF reads the header as an unsigned number: a negative one is not a number of seconds.
            raise ProblemError(400, f"{POLL} must be between 1 and {self.config.max_poll_seconds}, got {value}")
        return max(value, 1)  # 0 waits the least there is, as NVCF clamps it

    async def read_body(self, request: web.Request, request_id: str) -> Body:
        """Small bodies inline; the rest streamed into the object store."""
        maximum = self.config.max_request_body
        if request.content_length is not None and request.content_length > maximum:
            # Refused before a byte is read or stored.
            raise ProblemError(413, _too_large(maximum))
        limit = self.config.inline_body_limit
        head = bytearray()
        content = request.content
        while len(head) <= limit:
            chunk = await content.read(limit + 1 - len(head))
            if not chunk:
                return Body(bytes(head), None, len(head))
            head.extend(chunk)

        async def rest() -> AsyncIterator[bytes]:
            size = len(head)
            yield bytes(head)
            async for chunk in content.iter_chunked(1024 * 1024):
                size += len(chunk)
                if size > maximum:  # a body without Content-Length: what was stored of it is removed
                    raise ProblemError(413, _too_large(maximum))
                yield chunk

        name, size = await self.dispatcher.put_body(request_id, rest())
        return Body(b"", name, size)

    async def observed(self, entry: Entry) -> web.StreamResponse:
        """Run one invocation entry point, recorded in the metrics."""
        if self.metrics is None:
            return await entry(Observation())
        return await self.metrics.observe(entry)

    async def input_assets(
        self, principal: Principal, values: Iterable[str], *, source: str = ASSET_REFERENCES
    ) -> tuple[str, ...]:
        """The asset ids a request names: 400 for a bad id, 404 unless each is the caller's and uploaded."""
        asset_ids = parse_references(values, source=source)
        if asset_ids and self.assets is not None:
            await self.assets.check(principal.account, asset_ids)
        return asset_ids

    async def handle(
        self, request: web.Request, principal: Principal, fv: FunctionVersion, inv: Invocation
    ) -> web.StreamResponse:
        """An invocation honouring ``Idempotency-Key``; without the header it is :meth:`invoke`."""
        raw_key = inv.headers.get(IDEMPOTENCY_KEY) if self.idempotency is not None else None
        if raw_key is None or self.idempotency is None:
            return await self.invoke(request, principal, fv, inv)
        if inv.poll is None:
            inv = attrs.evolve(inv, poll=self.poll_seconds(inv.headers, streaming=wants_stream(inv.headers)))
        claim = await self.idempotency.claim(principal.account, fv, raw_key.strip())
        if not claim.owner:
            return await self.replay(request, claim.request_id, poll=inv.poll or 1, buffered=inv.buffered)
        try:
            return await self.invoke(request, principal, fv, inv, request_id=claim.request_id, keep=True)
        except BaseException:
            await self.idempotency.release(claim)  # it did not run: a retry may try again
            raise

    async def invoke(
        self,
        request: web.Request,
        principal: Principal,
        fv: FunctionVersion,
        inv: Invocation,
        *,
        request_id: str | None = None,
        keep: bool = False,
    ) -> web.StreamResponse:
        """Publish one request and answer it: streamed, or whole when buffered; ``keep`` stores it too."""
        method, path, headers, body, buffered = inv.method, inv.path, inv.headers, inv.body, inv.buffered
        poll = inv.poll
        started = time.perf_counter()
        if fv.is_grpc:
            raise ProblemError(
                400,
                f"function '{fv.id}' is a gRPC function (inferenceUrl /grpc): call its methods on the platform's "
                "gRPC port with 'authorization' and 'function-id' metadata, not over HTTP",
            )
        await self.limiter.admit(principal, fv)
        streaming = wants_stream(headers)
        if poll is None:
            poll = self.poll_seconds(headers, streaming=streaming)
        request_id = request_id or str(uuid.uuid4())
        if body is None:
            staged = await self.read_body(request, request_id)
        else:
            staged = await stage(self.dispatcher, self.config.inline_body_limit, request_id, body)
        req = new_request(
            principal,
            fv,
            request_id=request_id,
            reply=self.router.reply_subject(request_id, fv.version_id),
            method=method,
            path=path,
            headers=((k, v) for k, v in headers.items() if k.lower() not in DROPPED),
            body=staged,
            window=self.config.queue_deadline,
            poll_seconds=poll,
            streaming=streaming,
            asset_ids=inv.asset_ids,
        )
        pending = self.router.register(request_id, fv.version_id)
        try:
            dispatching = time.perf_counter()
            await self.dispatcher.publish(req)
            queued = time.perf_counter()
            timing = Timing(started=started, dispatching=dispatching, queued=queued)
            return await self.respond(request, pending, req, poll=poll, timing=timing, buffered=buffered, keep=keep)
        except BaseException:
            if not pending.detached:
                await self.dispatcher.cancel(fv.version_id, request_id, reason="the client went away")
            raise
        finally:
            if not pending.detached:
                self.router.forget(request_id)
                await self.dispatcher.drop_body(staged.object_name)  # answered, failed or abandoned: done with it

    async def respond(
        self,
        request: web.Request,
        pending: Pending,
        req: Request,
        *,
        poll: int,
        timing: Timing,
        buffered: bool = False,
        keep: bool = False,
    ) -> web.StreamResponse:
        try:
            first = await pending.next(timeout=poll)
        except TimeoutError:
            return await self.accepted(pending, req)
        head_at = time.perf_counter()
        if first.problem is not None:
            if keep:
                await self._keep_problem(req.request_id, first.problem.status, first.problem.detail)
            return problem(first.problem.status, first.problem.detail, req.request_id, instance=request.path)
        if first.status == 202:
            # The worker's progress report: the client polls for the rest.
            response = await self.accepted(pending, req, frame=first)
            return response
        extra = {"Server-Timing": timing.header(head_at)}
        return await self.stream(request, pending, first, extra=extra, buffered=buffered, keep=keep)

    async def stream(
        self,
        request: web.Request,
        pending: Pending,
        first: Frame,
        *,
        extra: Mapping[str, str],
        buffered: bool = False,
        keep: bool = False,
    ) -> web.StreamResponse:
        status = first.status or 200
        headers = CIMultiDict((k, v) for k, v in first.headers if k.lower() not in OWN_RESPONSE)
        headers[REQID] = first.request_id
        headers[STATUS] = nvcf_status(status)
        headers.update(extra)
        length = next((v for k, v in first.headers if k.lower() == "content-length"), None)
        if first.last and first.problem is None:
            if keep:
                await self._keep(first, first.body)
            return web.Response(status=status, headers=headers, body=first.body)
        if buffered:
            return await self._collect(request, pending, first, status, headers, keep=keep)
        response = web.StreamResponse(status=status, headers=headers)
        if length is not None and length.isdigit():
            response.content_length = int(length)
        await response.prepare(request)
        kept: list[bytes] | None = [] if keep else None
        kept_size = 0
        try:
            async for chunk in self._chunks(pending, first):
                await response.write(chunk)
                if kept is not None:
                    kept_size += len(chunk)
                    kept.append(chunk)
                    if kept_size > KEEP_LIMIT:
                        kept = None
                        await self._keep_problem(first.request_id, 409, _TOO_LARGE_TO_KEEP)
        except ResponseBroken as err:
            self.log.warning("aborting the response to %s: %s", first.request_id, err)
            if keep:
                await self._keep_problem(first.request_id, 502, str(err))
            transport = request.transport
            if transport is not None:
                transport.abort()  # a reset, never a silently truncated body
            return response
        await response.write_eof()
        if kept is not None:
            await self._keep(first, b"".join(kept))
        return response

    async def _chunks(self, pending: Pending, first: Frame) -> AsyncIterator[bytes]:
        """The body pieces of a response; ResponseBroken on a gap, a problem, a short body or silence."""
        written = 0
        frame = first
        expected = first.seq
        while True:
            if frame.seq != expected or frame.attempt != first.attempt:
                raise ResponseBroken(f"frame {frame.seq} (attempt {frame.attempt}) where {expected} was due")
            if frame.problem is not None:
                raise ResponseBroken(f"the response broke off: {frame.problem.detail}")
            if frame.body:
                written += len(frame.body)
                yield frame.body
            if frame.end:
                if frame.total_length is not None and frame.total_length != written:
                    raise ResponseBroken(f"{written} bytes arrived of {frame.total_length}")
                return
            expected += 1
            try:
                frame = await pending.next(timeout=self.config.queue_deadline)
            except TimeoutError:
                raise ResponseBroken("the response stopped arriving") from None

    async def _collect(
        self,
        request: web.Request,
        pending: Pending,
        first: Frame,
        status: int,
        headers: CIMultiDict[str],
        *,
        keep: bool,
    ) -> web.Response:
        """The whole response in memory (bounded), for callers that rewrap it."""
        parts: list[bytes] = []
        size = 0
        try:
            async for chunk in self._chunks(pending, first):
                size += len(chunk)
                if size > BUFFER_LIMIT:
                    if keep:
                        await self._keep_problem(first.request_id, 409, _TOO_LARGE_TO_KEEP)
                    return problem(
                        500,
                        f"the function's response exceeds {BUFFER_LIMIT} bytes, too large to wrap; use pexec",
                        first.request_id,
                        instance=request.path,
                    )
                parts.append(chunk)
        except ResponseBroken as err:
            self.log.warning("the response to %s broke off: %s", first.request_id, err)
            if keep:
                await self._keep_problem(first.request_id, 502, str(err))
            return problem(502, str(err), first.request_id, instance=request.path)
        body = b"".join(parts)
        if keep:
            await self._keep(first, body)
        return web.Response(status=status, headers=headers, body=body)

    async def _keep(self, first: Frame, body: bytes) -> None:
        """Store an idempotent request's response for its retries (a failure only costs the retries)."""
        if len(body) > KEEP_LIMIT:
            await self._keep_problem(first.request_id, 409, _TOO_LARGE_TO_KEEP)
            return
        with anyio.move_on_after(10, shield=True):
            try:
                await self.results.store(first.request_id, first.status or 200, first.headers, body)
            except BusError as err:
                self.log.warning("could not keep the response of %s for retries: %s", first.request_id, err)

    async def _keep_problem(self, request_id: str, status: int, detail: str) -> None:
        with anyio.move_on_after(10, shield=True):
            try:
                await self.results.store_problem(request_id, status, detail)
            except BusError as err:
                self.log.warning("could not keep the outcome of %s for retries: %s", request_id, err)

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
        poll = self.poll_seconds(request.headers, streaming=False)
        record = await self.results.record(request_id)
        if record is None:
            taken = await self.results.take(request_id)
            if taken is None:
                raise ProblemError(404, _unknown(request_id))
            return await self.render_result(request, *taken, buffered=buffered)
        if record.nca_id != principal.account:
            fv = self.routing.version(record.function_id, record.function_version_id)
            if fv is None or not self.routing.may_invoke(principal, fv):
                raise ProblemError(404, _unknown(request_id))
        if not await self.results.wait(request_id, poll):
            return web.Response(status=202, headers=await self.wait_headers(request_id, record.function_version_id))
        taken = await self.results.take(request_id)
        if taken is None:
            raise ProblemError(404, _unknown(request_id))
        return await self.render_result(request, *taken, buffered=buffered)

    async def replay(self, request: web.Request, request_id: str, *, poll: int, buffered: bool) -> web.StreamResponse:
        """A retry of an idempotent request: its kept result (left for the next retry), or 202 while it runs."""
        assert self.idempotency is not None
        record = await self.results.record(request_id)
        if record is not None and not await self.results.wait(request_id, poll):
            return web.Response(status=202, headers=await self.wait_headers(request_id, record.function_version_id))
        stored = await self.idempotency.stored(request_id)
        if stored is None:
            raise ProblemError(
                409,
                f"request '{request_id}' of this {IDEMPOTENCY_KEY} has finished and its result was already "
                f"fetched or has expired; send another {IDEMPOTENCY_KEY} to invoke again",
                headers={REQID: request_id},
            )
        return await self.render_result(request, *stored, buffered=buffered)

    async def render_result(
        self,
        request: web.Request,
        result: StoredResult,
        body: bytes | AsyncIterator[bytes],
        *,
        buffered: bool = False,
    ) -> web.StreamResponse:
        """A stored result as the response: headers and status as kept, the body inline or streamed."""
        headers = CIMultiDict((k, v) for k, v in result.headers if k.lower() not in OWN_RESPONSE)
        headers[REQID] = result.request_id
        headers[STATUS] = nvcf_status(result.status)
        if result.percent is not None:
            headers[PERCENT] = str(result.percent)
        if not isinstance(body, bytes) and buffered:
            if result.body_size > BUFFER_LIMIT:
                raise ProblemError(
                    500, f"the result ({result.body_size} bytes) is too large to wrap; poll it through pexec"
                )
            body = b"".join([chunk async for chunk in body])
        if isinstance(body, bytes):
            return web.Response(status=result.status, headers=headers, body=body)
        response = web.StreamResponse(status=result.status, headers=headers)
        response.content_length = result.body_size
        await response.prepare(request)
        async for chunk in body:
            await response.write(chunk)
        await response.write_eof()
        return response


@final
@attrs.frozen
class Timing:
    """When an invocation was received, began its durable publish, and was queued."""

    started: float
    dispatching: float
    queued: float

    def header(self, head_at: float) -> str:
        """``Server-Timing``: queue (receipt to queued), dispatch (the durable publish), execution (to the head)."""
        return (
            f"queue;dur={(self.queued - self.started) * 1000:.2f}, "
            f"dispatch;dur={(self.queued - self.dispatching) * 1000:.2f}, "
            f"execution;dur={(head_at - self.queued) * 1000:.2f}"
        )


_TOO_LARGE_TO_KEEP = (
    f"the response was delivered to the first caller; at over {KEEP_LIMIT} bytes it was too large to keep for retries"
)


def _too_large(maximum: int) -> str:
    return (
        f"the request body exceeds the invocation limit of {maximum} bytes (plugins.invocation.max_request_body); "
        "hand larger inputs to the function as assets (NVCF-INPUT-ASSET-REFERENCES)"
    )


def _unknown(request_id: str) -> str:
    return f"request '{request_id}' not found (unknown, or its result was already fetched)"


def problem(status: int, detail: str, request_id: str, *, instance: str | None = None) -> web.Response:
    """A problem+json answer carrying the request id."""
    return web.Response(
        status=status,
        body=json.dumps(problem_body(status, detail, instance=instance)).encode(),
        content_type=PROBLEM_CONTENT_TYPE,
        headers={REQID: request_id, STATUS: nvcf_status(status)},
    )


#: Host-based routing has no path of its own to document; the pexec operation describes it.
HOST_ROUTING_DOC = (
    "The same invocation is reachable without this path: a request whose Host is "
    "`<functionId>.invocation.<domain>` or `<versionId>.<functionId>.invocation.<domain>`, or that carries a "
    "`function-id` (and optionally `function-version-id`) header, invokes that function with the client's "
    "method, path, query and body passed through (Bearer with invoke_function, NVCF-POLL-SECONDS default 60)."
)


POLL_PARAM = Param(
    name=POLL, location="header", description="Seconds to wait for the response before a 202 (1-3600).",
    schema={"type": "integer", "minimum": 1, "maximum": 3600},
)  # fmt: skip

INVOKE_PARAMS = (
    POLL_PARAM,
    Param(
        name=ASSET_REFERENCES, location="header",
        description="Comma-separated ids of uploaded assets the function downloads (repeatable).",
    ),
    Param(
        name=IDEMPOTENCY_KEY, location="header",
        description="A retry with the same key answers for the same request instead of invoking again.",
    ),
)  # fmt: skip


async def pexec(late: Late[Invoker], call: Call[None], version_id: str | None) -> web.StreamResponse:
    invoker = late.get()

    async def entry(obs: Observation) -> web.StreamResponse:
        fv = await invoker.routing.resolve_current(call.principal, call.path("functionId"), version_id)
        obs.target(fv, call.principal.account)
        headers = call.request.headers
        asset_ids = await invoker.input_assets(call.principal, headers.getall(ASSET_REFERENCES, ()))
        return await invoker.handle(
            call.request,
            call.principal,
            fv,
            Invocation(method="POST", path=fv.inference_url or "/", headers=headers, asset_ids=asset_ids),
        )

    return await invoker.observed(entry)


@routes.route(
    "POST",
    "/v2/nvcf/pexec/functions/{functionId}",
    summary="Invoke any ACTIVE version of a function; the body and status pass through.",
    description=HOST_ROUTING_DOC,
    tag=TAG,
    scopes=(S.INVOKE_FUNCTION,),
    raw_body="*/*",
    raw_response="*/*",
    passthrough=True,
    params=INVOKE_PARAMS,
    errors=(404, 413, 429),
)
async def invoke_function(late: Late[Invoker], call: Call[None]) -> web.StreamResponse:
    return await pexec(late, call, None)


@routes.route(
    "POST",
    "/v2/nvcf/pexec/functions/{functionId}/versions/{versionId}",
    summary="Invoke one version of a function; the body and status pass through.",
    tag=TAG,
    scopes=(S.INVOKE_FUNCTION,),
    raw_body="*/*",
    raw_response="*/*",
    passthrough=True,
    params=INVOKE_PARAMS,
    errors=(404, 413, 429),
)
async def invoke_function_version(late: Late[Invoker], call: Call[None]) -> web.StreamResponse:
    return await pexec(late, call, call.path("versionId"))


@routes.route(
    "GET",
    "/v2/nvcf/pexec/status/{requestId}",
    summary="Poll a request that answered 202: its result (once), 202 while it runs, 404 when unknown.",
    tag=TAG,
    scopes=(S.INVOKE_FUNCTION,),
    raw_response="*/*",
    passthrough=True,
    params=(POLL_PARAM,),
    errors=(404,),
)
async def get_request_status(late: Late[Invoker], call: Call[None]) -> web.StreamResponse:
    return await late.get().poll(call.request, call.principal, call.path("requestId"))
