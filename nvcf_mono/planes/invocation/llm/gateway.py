"""The gateway's endpoints: OpenAI's API in front of the durable invocation path.

A call is authenticated like any invocation (Bearer, ``invoke_function``), its function chosen by
:class:`ModelCatalog`, its ``model`` rewritten to the function's own name for it, and then invoked
exactly as pexec does (queued durably, rate limited by the function's ``rateLimit``, a function at zero
woken, ``NVCF-REQID``, ``Idempotency-Key``), at the same path on the function: ``/v1/chat/completions``
reaches the function's ``/v1/chat/completions``. Streams pass through as the function writes them.
Every refusal is an OpenAI error (:mod:`.errors`).
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, final

from aiohttp import web

from nvcf_mono.auth import scopes as S
from nvcf_mono.auth.principal import AuthError, Principal
from nvcf_mono.auth.strategy import Authenticator
from nvcf_mono.contracts.frames import COMPATIBILITY_OFF
from nvcf_mono.http.api import BodyTooLarge, read_within
from nvcf_mono.http.bad_requests import unreadable_body
from nvcf_mono.http.problem import ProblemError
from nvcf_mono.late import Late, NotReady
from nvcf_mono.metrics import Metrics
from nvcf_mono.models.function import FunctionVersion
from nvcf_mono.planes.invocation import affinity
from nvcf_mono.planes.invocation.held_input import Hold
from nvcf_mono.planes.invocation.http import Invocation, Invoker
from nvcf_mono.planes.invocation.idempotency import IDEMPOTENCY_KEY
from nvcf_mono.planes.invocation.llm.errors import GatewayError, error_response, in_openai_shape, platform_problem
from nvcf_mono.planes.invocation.llm.limits import Lease, Limits, estimate_tokens
from nvcf_mono.planes.invocation.llm.models import ModelCatalog, created_epoch
from nvcf_mono.planes.invocation.llm.settings import LlmGatewaySettings
from nvcf_mono.planes.invocation.llm.shallow import NotJson, ShallowObject, json_type
from nvcf_mono.planes.invocation.llm.usage import UsageMeter
from nvcf_mono.planes.invocation.metrics import REQUEST_LATENCY_BUCKETS, Observation

#: The OpenAI operations the gateway forwards, each to the same path on the function.
FORWARDED = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses")
#: Every route of the gateway. OpenAI's API documents them (errors in its shape), not /v3/openapi.
ROUTES = (
    *(("POST", path) for path in FORWARDED),
    ("GET", "/v1/models"),
    ("GET", "/v1/models/{model:.+}"),
    ("GET", "/v1/health/ready"),
    ("GET", "/v1/health/live"),
)
#: Where a page in a browser may call the gateway (CORS), as it may call OpenAI's API or a vLLM server.
CROSS_ORIGIN = (*FORWARDED, "/v1/models", "/v1/health/")
#: OpenAI's API under /v1, what the gateway serves and what it does not: a path there that has no
#: route (or not for its method) is answered in OpenAI's shape, so an OpenAI client says why. The
#: platform's own /v1 routes (keys, tasks, admin) keep their problem+json.
OPENAI_FAMILIES = frozenset(
    (
        *("chat", "completions", "embeddings", "responses", "models", "health"),
        *("audio", "images", "files", "uploads", "batches", "fine_tuning", "moderations"),
        *("assistants", "threads", "vector_stores", "realtime", "evals", "conversations"),
    )
)
REQUEST_ID = "X-Request-ID"
_REQUEST_ID_RX = re.compile(r"^[\x21-\x7e]{1,128}$")


def request_id_of(request: web.Request) -> str:
    """The caller's ``X-Request-ID`` when it is a plain token, else a new one."""
    given = request.headers.get(REQUEST_ID, "").strip()
    return given if _REQUEST_ID_RX.match(given) else f"req-{uuid.uuid4().hex}"


#: The operations that hold a conversation: a call that names none gets one, to send back with its next turn.
CONVERSATIONS = frozenset({"/v1/chat/completions", "/v1/responses"})


def conversation_of(request: web.Request, doc: ShallowObject) -> str | None:
    """The conversation a call continues, for session affinity (and the function).

    OpenAI's ``prompt_cache_key``, else the ``x-multi-turn-session-id`` a client sends back, else a new
    one for a chat or a response (returned in that header, so the next turn can name it).
    """
    named = doc.get("prompt_cache_key")
    if not isinstance(named, str) or not named.strip():
        named = request.headers.get(affinity.HEADER, "")
    if named.strip():
        return header_safe(named.strip())
    return f"{affinity.MINTED}{uuid.uuid4().hex}" if request.path in CONVERSATIONS else None


_HEADER_SAFE_RX = re.compile(r"^[\x21-\x7e](?:[\x20-\x7e]{0,254}[\x21-\x7e])?$")


def header_safe(key: str) -> str:
    """The key itself when it can travel as a header value, else a digest of it.

    OpenAI takes any string as ``prompt_cache_key`` (a user's name in any script, a line break); the
    same key always gives the same value, so its conversation keeps its instance either way.
    """
    if _HEADER_SAFE_RX.match(key):
        return key
    return "pck-" + hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()[:32]


@final
class Gateway:
    """One per invocation plane; its parts come late, with the plane's ``run()``."""

    def __init__(
        self,
        settings: LlmGatewaySettings,
        invoker: Late[Invoker],
        authenticator: Late[Authenticator],
        metrics: Metrics,
        log: logging.Logger,
    ) -> None:
        self.settings = settings
        self.invoker = invoker
        self.authenticator = authenticator
        self.limits = Limits(settings)
        self.log = log
        self._catalog: ModelCatalog | None = None
        #: Why this node cannot forward now (stopping, its bus lost), or None: set when the plane runs.
        self.unready: Late[Callable[[], str | None]] = Late("the invocation plane")
        self.requests = metrics.counter(
            "llm_api_gateway_http_requests_total",
            "Calls through the OpenAI-compatible gateway, by function and status.",
            ("function_id", "code"),
        )
        self.duration = metrics.histogram(
            "llm_api_gateway_http_request_duration_seconds",
            "Time from a gateway call's arrival to the end of its answer, by function.",
            ("function_id",),
            buckets=REQUEST_LATENCY_BUCKETS,
        )
        self.tokens = metrics.counter(
            "llm_api_gateway_tokens_total",
            "Tokens the functions reported (or the gateway estimated) for gateway calls, by function.",
            ("function_id",),
        )

    @property
    def catalog(self) -> ModelCatalog:
        if self._catalog is None:
            self._catalog = ModelCatalog(self.invoker.get().routing, self.settings.models)
        return self._catalog

    def routes(self) -> list[tuple[str, str, Callable[[web.Request], Awaitable[web.StreamResponse]]]]:
        """What the plane serves (:data:`ROUTES`): OpenAI's operations, the model list, a readiness probe."""
        handlers = {"/v1/models": self.list_models, "/v1/models/{model:.+}": self.get_model}
        handlers["/v1/health/ready"], handlers["/v1/health/live"] = self.ready, self.live
        return [(method, path, handlers.get(path, self.forward)) for method, path in ROUTES]

    async def principal(self, request: web.Request) -> Principal:
        try:
            principal = await self.authenticator.get().authenticate(request.headers.get("Authorization"))
            principal.require(S.INVOKE_FUNCTION)
        except AuthError as err:
            raise GatewayError(err.status, err.detail) from None
        return principal

    async def forward(self, request: web.Request) -> web.StreamResponse:
        """A chat, completion, embedding or response call, forwarded to the function that serves its model."""
        started = time.perf_counter()
        request_id = request_id_of(request)
        function_id = "unknown"
        lease: Lease | None = None
        try:
            principal = await self.principal(request)
            with self.invoker.get().held.hold(principal.account) as hold:  # the raw body, until parsed
                doc, size = await self._read(request, hold)
            target = await self.catalog.target(principal, request.headers, doc["model"])
            function_id = target.fv.id
            lease = self.limits.admit(principal, estimate_tokens(doc, size))
            doc.replace("model", target.downstream)
            response, used = await self._invoke(request, principal, doc, target.fv, request_id, limits=lease.headers)
            lease.settle(used)
        except NotReady:
            response = error_response(
                503, "the gateway is starting; try again in a moment", headers={"Retry-After": "1"}
            )
        except GatewayError as err:
            response = err.response()
        except ProblemError as err:
            if lease is not None:
                lease.settle(0)  # refused before the function ran (its rate limit, a full queue): nothing spent
            response = platform_problem(err.status, err.detail, err.headers)
        else:
            self.tokens.inc(lease.estimate, function_id=function_id)
        if not response.prepared:
            response.headers[REQUEST_ID] = request_id
        self.requests.inc(function_id=function_id, code=str(response.status))
        if function_id != "unknown":
            self.duration.observe(time.perf_counter() - started, function_id=function_id)
        return response

    async def _read(self, request: web.Request, hold: Hold) -> tuple[ShallowObject, int]:
        """The JSON body and its size; 400 unless it names a model, 413 past ``max_request_body``, 429 past
        the account's input held on this node (``hold``).
        """
        limit = self.invoker.get().config.max_request_body
        try:
            raw = await read_within(request, limit, each=hold.take)
        except BodyTooLarge:
            raise GatewayError(413, f"the request body exceeds {limit} bytes") from None
        except web.RequestPayloadError as err:
            # The rest of the body cannot be read past: the client must not send more on this connection.
            raise GatewayError(400, unreadable_body(err), headers={"Connection": "close"}) from None
        try:
            doc = ShallowObject.parse(raw)
        except NotJson as err:
            raise GatewayError(400, str(err)) from None
        model = doc.get("model")
        if model is not None and not isinstance(model, str):
            detail = f"Invalid type for 'model': expected a string, but got {json_type(model)} instead."
            raise GatewayError(400, detail, param="model")
        if model is None or not model.strip():
            raise GatewayError(400, "You must provide a model parameter.", param="model")
        if "stream" in doc and not isinstance(doc.get("stream"), bool):
            raise GatewayError(400, "'stream' must be true or false.", param="stream")
        return doc, len(raw)

    async def _invoke(
        self,
        request: web.Request,
        principal: Principal,
        doc: ShallowObject,
        fv: FunctionVersion,
        request_id: str,
        *,
        limits: Mapping[str, str],
    ) -> tuple[web.StreamResponse, int | None]:
        """Invoke as pexec does; the answer in OpenAI's shape and the tokens it reported. ``limits``: the
        caller's ``x-ratelimit-*`` headers for the answer.
        """
        invoker = self.invoker.get()
        streaming = doc.get("stream") is True
        headers = {
            "Content-Type": "application/json",
            "Accept": "text/event-stream" if streaming else "application/json",
            REQUEST_ID: request_id,
            # An OpenAI client takes the answer itself: never a 302 to a zip of it, nor a progress 202.
            COMPATIBILITY_OFF: "true",
        }
        if IDEMPOTENCY_KEY in request.headers:
            headers[IDEMPOTENCY_KEY] = request.headers[IDEMPOTENCY_KEY]
        conversation = conversation_of(request, doc)
        answer_headers = {**limits, REQUEST_ID: request_id}
        if conversation:
            headers[affinity.HEADER] = answer_headers[affinity.HEADER] = conversation
        meter = UsageMeter(streaming=streaming)
        inv = Invocation(
            method="POST",
            path=request.path,
            headers=headers,
            body=doc.encode(),
            poll=self.settings.wait_seconds,
            tap=meter.feed,
            response_headers=answer_headers,
        )

        async def entry(obs: Observation) -> web.StreamResponse:
            obs.target(fv, principal.account)
            return await invoker.handle(request, principal, fv, inv)

        response = await invoker.observed(entry)
        used = meter.finish()
        if response.status == 202 and not response.prepared:
            reqid = response.headers.get("NVCF-REQID", "")
            raise GatewayError(
                504,
                f"The model did not start answering within {self.settings.wait_seconds}s. The request goes on: "
                f"its result is kept for GET /v2/nvcf/pexec/status/{reqid}.",
                headers={"NVCF-REQID": reqid},  # no Retry-After: the call goes on, a resend would run it again
            )
        if isinstance(response, web.Response):
            response = in_openai_shape(response)
        return response, used

    async def list_models(self, request: web.Request) -> web.StreamResponse:
        """The models the caller may use: its account's and those shared with it."""
        try:
            principal = await self.principal(request)
        except GatewayError as err:
            return _identified(request, err.response())
        data = [_card(name, fv) for name, (_, fv) in self.catalog.visible(principal).items()]
        return _identified(request, web.json_response({"object": "list", "data": data}))

    async def get_model(self, request: web.Request) -> web.StreamResponse:
        """One model the caller may use: a listed name, or ``<functionId>/<model>`` as calls may name it."""
        try:
            principal = await self.principal(request)
            name = request.match_info["model"]
            found = self.catalog.find(principal, name)
            fv = found[1] if found is not None else None
            if fv is None and "/" in name:
                fv = (await self.catalog.target(principal, {}, name)).fv
            if fv is None:
                raise GatewayError(404, f"The model '{name}' does not exist or you do not have access to it.")
        except GatewayError as err:
            return _identified(request, err.response())
        except ProblemError as err:
            return _identified(request, platform_problem(err.status, err.detail, err.headers))
        return _identified(request, web.json_response(_card(name, fv)))

    async def ready(self, request: web.Request) -> web.StreamResponse:
        """200 while the gateway can forward: the plane runs, the node is not stopping, its bus is up.

        A balancer that probes this stops sending calls to a node as soon as its drain begins.
        """
        if not self.invoker.is_set or not self.unready.is_set:
            return error_response(503, "the gateway is starting", headers={"Retry-After": "1"})
        why = self.unready.get()()
        if why is not None:
            return error_response(503, f"the gateway cannot take calls: {why}", headers={"Retry-After": "1"})
        return web.json_response({"status": "ready"})

    async def live(self, request: web.Request) -> web.StreamResponse:
        """200 while the process serves HTTP at all (a liveness probe: restart only when this fails)."""
        return web.json_response({"status": "live"})


def _is_openai_path(path: str) -> bool:
    parts = path.split("/", 3)
    return len(parts) > 2 and parts[1] == "v1" and parts[2] in OPENAI_FAMILIES


@web.middleware
async def openai_route_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """OpenAI's 404 for a path of its API the gateway does not serve, 405 for a method it does not."""
    try:
        return await handler(request)
    except web.HTTPException as err:
        unrouted = request.match_info.route.resource is None
        if not _is_openai_path(request.path) or not (err.status == 405 or (err.status == 404 and unrouted)):
            raise
        where = f"{request.method} {request.path}"
        if err.status == 404:
            return _identified(
                request, error_response(404, f"Invalid URL ({where}): the gateway does not serve it", code=None)
            )
        allowed = err.headers.get("Allow", "")
        message = f"Method not allowed ({where}); this path takes {allowed or 'no other method'}"
        return _identified(request, error_response(405, message, code=None, headers={"Allow": allowed}))


def _identified(request: web.Request, response: web.Response) -> web.Response:
    """The answer with the call's ``X-Request-ID`` (the caller's, or a new one)."""
    response.headers[REQUEST_ID] = request_id_of(request)
    return response


def _card(name: str, fv: FunctionVersion) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": int(created_epoch(fv)), "owned_by": fv.nca_id}
