"""NVCF's HTTP invocation: pexec, and the Invoker every entry point (pexec, exec, Host routing) calls.

A request is published to its version's durable buffer and the client waits up to
``NVCF-POLL-SECONDS`` for the response head. A response that starts in time is streamed through
as the worker produces it (``answers.ReplyWriter``); otherwise the client gets ``202`` with
``NVCF-REQID`` and the request stays queued or running, its result kept for a status poll on any
node (``waiting.Waiting``). What the caller sent is read by ``intake``. A client that hangs up
before it got a 202 cancels its request.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import final

import anyio
import attrs
from aiohttp import web

from nvcf_mono import tracing
from nvcf_mono.auth import scopes as S
from nvcf_mono.auth.principal import Principal
from nvcf_mono.contracts import trace
from nvcf_mono.contracts.frames import Request
from nvcf_mono.http import signed_links
from nvcf_mono.http.api import Call, Param, Routes
from nvcf_mono.http.downloads import stream_object
from nvcf_mono.http.problem import ProblemError
from nvcf_mono.late import Late
from nvcf_mono.log import bind, unbind
from nvcf_mono.models.common import new_id
from nvcf_mono.models.function import FunctionVersion
from nvcf_mono.planes.invocation.answers import (
    POLL,
    ReplyWriter,
    forwarded_headers,
    problem,
    wants_stream,
)
from nvcf_mono.planes.invocation.config import InvocationConfig
from nvcf_mono.planes.invocation.dispatch import Dispatcher
from nvcf_mono.planes.invocation.held_input import HeldInput, Hold
from nvcf_mono.planes.invocation.idempotency import (
    CLAIM_ATTEMPTS,
    FINGERPRINTED,
    IDEMPOTENCY_KEY,
    Idempotency,
    fingerprint,
)
from nvcf_mono.planes.invocation.input_assets import ASSET_REFERENCES, InputAssets, parse_references
from nvcf_mono.planes.invocation.intake import new_request, poll_seconds, read_body, read_prefix, stage
from nvcf_mono.planes.invocation.large_responses import ROUTE as LARGE_RESPONSE_ROUTE
from nvcf_mono.planes.invocation.large_responses import LargeResponses
from nvcf_mono.planes.invocation.metrics import CLIENT_GONE, Entry, InvocationMetrics, Observation
from nvcf_mono.planes.invocation.ratelimit import RateLimiter
from nvcf_mono.planes.invocation.responses import Pending, ResponseRouter
from nvcf_mono.planes.invocation.results import ResultStore
from nvcf_mono.planes.invocation.routing import RoutingTable
from nvcf_mono.planes.invocation.waiting import Waiting

TAG = "invocation"
#: Pexec and its status poll (exec and Host routing live in their own modules).
routes: Routes[Late[Invoker]] = Routes()


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
    #: What was read of the request's body already (an Idempotency-Key's fingerprint); the rest follows.
    head: bytes = b""
    #: Answer with the whole response (exec wraps it), not streamed through.
    buffered: bool = False
    #: Given each piece of the response body as it is written (the LLM gateway counts tokens with it).
    tap: Callable[[bytes], None] | None = None
    #: Headers added to the function's response (not to a problem or a 202).
    response_headers: Mapping[str, str] = attrs.field(factory=dict)


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
        large_responses: LargeResponses | None = None,
    ) -> None:
        self.config = config
        self.routing = routing
        self.dispatcher = dispatcher
        self.router = router
        self.writer = ReplyWriter(results=results, frame_timeout=config.queue_deadline, log=log)
        self.waiting = Waiting(
            config=config,
            routing=routing,
            dispatcher=dispatcher,
            results=results,
            writer=self.writer,
            adopt=adopt,
            idempotency=idempotency,
        )
        self.limiter = limiter
        self.log = log
        self.assets = assets
        self.idempotency = idempotency
        self.metrics = metrics
        self.large_responses = large_responses
        self.held = HeldInput(config.account_held_input_max_bytes, config.account_calls_in_flight_max)
        if metrics is not None:
            metrics.watch(self.held)

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
        """An invocation honouring ``Idempotency-Key``; without the header it is :meth:`invoke`.

        What it holds of the client's input counts towards its account's share of this node until it ends.
        """
        with self.held.hold(principal.account) as hold:
            hold.take(len(inv.body or b""))
            return await self._handle(request, principal, fv, inv, hold)

    async def _handle(
        self, request: web.Request, principal: Principal, fv: FunctionVersion, inv: Invocation, hold: Hold
    ) -> web.StreamResponse:
        raw_key = inv.headers.get(IDEMPOTENCY_KEY) if self.idempotency is not None else None
        if raw_key is None or self.idempotency is None:
            return await self.invoke(request, principal, fv, inv, hold=hold)
        if inv.poll is None:
            inv = attrs.evolve(inv, poll=poll_seconds(self.config, inv.headers, streaming=wants_stream(inv.headers)))
        if inv.body is None:
            inv = attrs.evolve(inv, head=await read_prefix(self.config, request, FINGERPRINTED + 1, hold=hold))
        mark = fingerprint(inv.head if inv.body is None else inv.body)
        for _ in range(CLAIM_ATTEMPTS):
            claim = await self.idempotency.claim(principal.account, fv, raw_key.strip(), mark)
            if claim.owner:
                break
            if claim.fingerprint and claim.fingerprint != mark:
                raise ProblemError(
                    422,
                    f"this {IDEMPOTENCY_KEY} was first used with a different request body (request "
                    f"{claim.request_id}); a retry must send the same body, and a new request needs a new key",
                )
            replayed = await self.waiting.replay(request, claim, poll=inv.poll or 1, buffered=inv.buffered)
            if replayed is not None:
                return replayed
            # The request the key named was released (it never ran): claim the key again.
        else:
            raise ProblemError(409, f"concurrent requests with this {IDEMPOTENCY_KEY} keep failing; retry")
        try:
            return await self.invoke(request, principal, fv, inv, request_id=claim.request_id, keep=True, hold=hold)
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
        hold: Hold,
    ) -> web.StreamResponse:
        """Publish one request and answer it: streamed, or whole when buffered; ``keep`` stores it too.

        Every log line written meanwhile names the request, its function and version.
        """
        request_id = request_id or new_id()
        token = bind(request_id, fv.id, fv.version_id)
        # Switched off, tracing costs the hot path one check: no span name or attributes are built.
        span = (
            tracing.start(
                f"{request.method} {_route(request)}",
                parent=tracing.extract(request.headers),
                kind="server",
                **{trace.REQUEST_ID: request_id, trace.FUNCTION_ID: fv.id, trace.FUNCTION_VERSION_ID: fv.version_id},
            )
            if tracing.enabled()
            else None
        )
        status, error = 500, None
        try:
            response = await self._invoke(
                request, principal, fv, inv, request_id=request_id, keep=keep, span=span, hold=hold
            )
            status = response.status
            return response
        except ProblemError as err:
            status, error = err.status, err.detail
            raise
        except anyio.get_cancelled_exc_class():
            status = CLIENT_GONE  # the caller hung up
            raise
        except BaseException as err:
            error = type(err).__name__
            raise
        finally:
            tracing.end(span, error=error if status >= 500 else None, **{"http.response.status_code": status})
            unbind(token)

    async def _invoke(
        self,
        request: web.Request,
        principal: Principal,
        fv: FunctionVersion,
        inv: Invocation,
        *,
        request_id: str,
        keep: bool,
        span: tracing.Span | None,
        hold: Hold,
    ) -> web.StreamResponse:
        method, path, headers, body = inv.method, inv.path, inv.headers, inv.body
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
            poll = poll_seconds(self.config, headers, streaming=streaming)
        if body is None:
            staged = await read_body(self.config, self.dispatcher, request, request_id, prefix=inv.head, hold=hold)
        else:
            staged = await stage(self.dispatcher, self.dispatcher.inline_limit, request_id, body)
        pending = self.router.register(request_id, fv.version_id)
        enqueue = tracing.start("enqueue", parent=span, kind="producer")
        forwarded: Iterable[tuple[str, str]] = forwarded_headers(headers)
        if enqueue is not None:
            forwarded = tracing.replace_context(forwarded, enqueue)  # the worker's spans follow this one
        req = new_request(
            principal,
            fv,
            request_id=request_id,
            reply=pending.reply,
            method=method,
            path=path,
            headers=forwarded,
            body=staged,
            window=self.config.queue_deadline,
            poll_seconds=poll,
            region=self.dispatcher.region,
            streaming=streaming,
            asset_ids=inv.asset_ids,
        )
        try:
            dispatching = time.perf_counter()
            try:
                await self.dispatcher.publish(req)
            finally:
                tracing.end(enqueue)
            queued = time.perf_counter()
            timing = Timing(started=started, dispatching=dispatching, queued=queued)
            return await self.respond(request, pending, req, inv, poll=poll, timing=timing, keep=keep, span=span)
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
        inv: Invocation,
        *,
        poll: int,
        timing: Timing,
        keep: bool = False,
        span: tracing.Span | None = None,
    ) -> web.StreamResponse:
        try:
            first = await pending.next(timeout=poll)
        except TimeoutError:
            return await self.waiting.accepted(pending, req)
        head_at = time.perf_counter()
        if first.problem is not None:
            if keep:
                await self.writer.keep_problem(req.request_id, first.problem.status, first.problem.detail)
            return problem(first.problem.status, first.problem.detail, req.request_id, instance=request.path)
        if first.status == 202:
            # The worker's progress report: the client polls for the rest.
            response = await self.waiting.accepted(pending, req, frame=first)
            return response
        extra = {**inv.response_headers, "Server-Timing": timing.header(head_at, first.timing)}
        phases = timing.phases(head_at, first.timing)
        if phases is not None and self.metrics is not None:
            self.metrics.phases(req.function_id, req.function_version_id, *phases)
        relay = tracing.start("relay", parent=span)
        try:
            return await self.writer.stream(
                request, pending, first, extra=extra, buffered=inv.buffered, keep=keep, tap=inv.tap
            )
        finally:
            tracing.end(relay)


def _route(request: web.Request) -> str:
    """The route a request matched, as declared (ids stay out of span names)."""
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else "/"


@final
@attrs.frozen
class Timing:
    """When an invocation was received, began its durable publish, and was stored in its queue."""

    started: float
    dispatching: float
    queued: float

    def phases(self, head_at: float, worker: tuple[float, float] | None) -> tuple[float, float] | None:
        """(queue wait, execution) in seconds, from the worker's timing of the head's frame."""
        if worker is None:
            return None
        taken_ms, execution_ms = worker
        waited = max(0.0, head_at - self.queued - taken_ms / 1000)  # the hops there and back included
        return waited, execution_ms / 1000

    def header(self, head_at: float, worker: tuple[float, float] | None) -> str:
        """``Server-Timing``: intake (received to stored), enqueue (the durable publish, part of intake),
        queue (waiting to be taken by an instance: a cold start shows here), prepare (the worker's, before
        the call: assets, health), execution (the function, to its response head).

        Without the worker's timing the queue and the function cannot be told apart: one ``wait``.
        """
        intake = (
            f'intake;desc="received to stored";dur={(self.queued - self.started) * 1000:.2f}, '
            f"enqueue;dur={(self.queued - self.dispatching) * 1000:.2f}"
        )
        phases = self.phases(head_at, worker)
        if worker is None or phases is None:
            return f'{intake}, wait;desc="queue and function";dur={(head_at - self.queued) * 1000:.2f}'
        taken_ms, execution_ms = worker
        return (
            f'{intake}, queue;desc="waiting for an instance";dur={phases[0] * 1000:.2f}, '
            f"prepare;dur={max(0.0, taken_ms - execution_ms):.2f}, "
            f'execution;desc="the function until its response head";dur={execution_ms:.2f}'
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
    errors=(404, 409, 413, 422, 429, 507),
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
    errors=(404, 409, 413, 422, 429, 507),
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
    invoker = late.get()
    with invoker.held.hold(call.principal.account):  # a poll waits like a call: it counts as one in flight
        return await invoker.waiting.poll(call.request, call.principal, call.path("requestId"))


@routes.route(
    "HEAD",
    "/v2/nvcf/pexec/status/{requestId}",
    summary="Whether a request's result is ready, without fetching it: the GET's status and headers now.",
    tag=TAG,
    scopes=(S.INVOKE_FUNCTION,),
    passthrough=True,
    errors=(404,),
)
async def peek_request_status(late: Late[Invoker], call: Call[None]) -> web.StreamResponse:
    return await late.get().waiting.peek(call.principal, call.path("requestId"))


@routes.route(
    "GET",
    LARGE_RESPONSE_ROUTE,
    summary="Download a large response: the function's body and output files, zipped, behind a 302's Location.",
    description="Authorized by the link itself: send no bearer. 403 for an altered or expired link; 404 once "
    "the result is no longer kept (plugins.invocation.result_ttl).",
    tag=TAG,
    auth="none",
    raw_response="application/zip",
    params=signed_links.LINK_PARAMS,
    errors=(403, 404, 503),
)
async def download_large_response(late: Late[Invoker], call: Call[None]) -> web.StreamResponse:
    invoker = late.get()
    request_id = call.path("requestId")
    large = invoker.large_responses
    if large is None:
        raise ProblemError(404, "this node keeps no large responses")
    large.check(request_id, call.query("expires"), call.query("signature"))
    return await stream_object(
        call.request,
        large.open(request_id),
        headers={"Content-Type": "application/zip", "Content-Disposition": f'attachment; filename="{request_id}.zip"'},
        missing=f"the large response of request {request_id} is no longer kept",
        what=f"the large response of request {request_id}",
        log=invoker.log,
    )
