"""Assemble and run the host's aiohttp server: plugin routes and middlewares, errors, health, metrics."""

from __future__ import annotations

import asyncio
import logging
import random
import ssl
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, final

import anyio
import attrs
from aiohttp import web

from nvcf_mono.bus.errors import BusError, BusUnavailable, InvalidKey, RequestTimeout, StoreFull
from nvcf_mono.config.model import HttpSettings
from nvcf_mono.errors import NvcfMonoError
from nvcf_mono.http.api import MAX_JSON_BODY
from nvcf_mono.http.bad_requests import ProblemAppRunner, unreadable_body
from nvcf_mono.http.problem import ProblemError, problem_response
from nvcf_mono.late import NotReady
from nvcf_mono.lifecycle import HTTP_REQUEST, InflightTracker
from nvcf_mono.metrics import Metrics
from nvcf_mono.plugin import Contributions, Route

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
IsRunning = Callable[[str], bool]


class HttpServerError(NvcfMonoError):
    """The server could not be assembled or bound."""


def _gate(route: Route, is_running: IsRunning) -> Handler:
    """Answer 503 until the plugin that owns the route is running."""
    owner, handler = route.owner, route.handler

    async def gated(request: web.Request) -> web.StreamResponse:
        if not is_running(owner):
            raise ProblemError(
                503,
                f"this endpoint is served by plugin {owner!r}, which is not running yet",
                headers={"Retry-After": "1"},
            )
        result: web.StreamResponse = await handler(request)
        return result

    gated.__name__ = getattr(handler, "__name__", "handler")
    return gated


def _gate_middleware(owner: str, middleware: Any, is_running: IsRunning) -> Any:
    @web.middleware
    async def gated(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not is_running(owner):
            return await handler(request)
        result: web.StreamResponse = await middleware(request, handler)
        return result

    return gated


#: The header an invocation's answer names its request with: the access log keeps it.
REQUEST_ID_HEADER = "NVCF-REQID"


@final
class HttpServer:
    """One aiohttp application: host routes, plugin routes (gated by plugin state), shared middlewares."""

    def __init__(
        self,
        settings: HttpSettings,
        contributions: Contributions,
        *,
        host_routes: Sequence[tuple[str, str, Handler]],
        is_running: IsRunning,
        inflight: InflightTracker,
        metrics: Metrics,
        log: logging.Logger,
        ssl_context: ssl.SSLContext | None = None,
        access_log: float = 0.0,
        route_hint: Callable[[str], str | None] = lambda _path: None,
    ) -> None:
        self._settings = settings
        #: Where a path this server has no route for is served instead (a split deployment's other nodes).
        self._route_hint = route_hint
        self._ssl = ssl_context
        self._log = log
        #: The share of requests written to the access log (0: none).
        self._access_share = access_log
        self._access = logging.getLogger("nvcf_mono.access")
        self._inflight = inflight
        self._requests = metrics.counter(
            "http_requests_total", "HTTP requests answered.", ["method", "route", "status"]
        )
        self._latency = metrics.histogram(
            "http_request_duration_seconds", "Time to the response head.", ["method", "route"]
        )
        self._pending = metrics.gauge("http_requests_pending", "HTTP requests in progress.")
        self._pending.set_function(lambda: [((), float(self._inflight.of(HTTP_REQUEST)))])
        middlewares = [self._outer]
        for owner, _order, mw in sorted(contributions.middlewares, key=lambda item: item[1]):
            middlewares.append(_gate_middleware(owner, mw, is_running))
        self.app = web.Application(
            middlewares=middlewares,
            client_max_size=settings.max_request_body,
            handler_args={"keepalive_timeout": settings.keepalive_timeout},
        )
        self.app[MAX_JSON_BODY] = settings.max_json_body
        if contributions.response_hooks:
            hooks = tuple(contributions.response_hooks)

            async def on_prepare(request: web.Request, response: web.StreamResponse) -> None:
                for owner, hook in hooks:
                    if is_running(owner):
                        hook(request, response)

            self.app.on_response_prepare.append(on_prepare)
        seen: dict[tuple[str, str], str] = {}
        routes = [Route(owner="host", method=m, path=path, handler=handler) for m, path, handler in host_routes]
        routes += [attrs.evolve(route, handler=_gate(route, is_running)) for route in contributions.routes]
        for route in routes:
            key = (route.method, route.path)
            if key in seen:
                raise HttpServerError(
                    f"{route.method} {route.path} is served by both {seen[key]!r} and {route.owner!r}"
                )
            seen[key] = route.owner
            try:
                self.app.router.add_route(route.method, route.path, route.handler, name=route.name)
            except (ValueError, RuntimeError) as err:
                raise HttpServerError(
                    f"plugin {route.owner!r}: cannot serve {route.method} {route.path}: {err}"
                ) from err
        explicit = {path for method, path in seen if method == "HEAD"}
        for route in routes:
            if route.method == "GET" and route.head and route.path not in explicit:
                # aiohttp sends the head of the GET's answer without its body.
                self.app.router.add_route("HEAD", route.path, route.handler)
        self._runner: ProblemAppRunner | None = None
        self._site: web.TCPSite | None = None
        self.port = 0

    @web.middleware
    async def _outer(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Counts in-flight work, renders every error as problem+json, records metrics (and the access log)."""
        started = time.perf_counter()
        status = 500
        request_id = None
        self._inflight.enter(HTTP_REQUEST)
        try:
            try:
                response = await handler(request)
            except ProblemError as err:
                response = err.response(request.path)
            except web.HTTPException as err:
                if err.status < 400:
                    raise
                detail = err.text if err.text and not err.text.startswith(f"{err.status}:") else err.reason
                if err.status == 404 and request.match_info.route.resource is None:
                    hint = self._route_hint(request.path)
                    detail = f"no route for {request.method} {request.path}" + (f"; {hint}" if hint else "")
                elif err.status == 405:
                    detail = f"method {request.method} is not allowed on {request.path}"
                elif err.status == 413:
                    detail = f"request body exceeds the limit of {self._settings.max_request_body} bytes"
                headers = {k: v for k, v in err.headers.items() if k.lower() in ("allow", "retry-after")}
                response = problem_response(err.status, detail, instance=request.path, headers=headers)
            except web.RequestPayloadError as err:
                response = problem_response(400, unreadable_body(err), instance=request.path)
                response.force_close()  # the rest of the body cannot be read past: the connection ends
            except NotReady as err:
                response = problem_response(503, str(err), instance=request.path, headers={"Retry-After": "1"})
            except InvalidKey as err:
                # An id from the request (a header, a body field) that no stored item can have.
                self._log.debug("%s %s names an impossible key: %s", request.method, request.path, err)
                response = problem_response(
                    400,
                    "the request names an id that is not valid: ids have letters, digits, '-', '_' and single '.'",
                    instance=request.path,
                )
            except (asyncio.CancelledError, anyio.get_cancelled_exc_class()):
                status = 499  # the client went away
                raise
            except (StoreFull, BusUnavailable, RequestTimeout) as err:
                # Conditions that pass: the caller should retry later, not treat it as a server bug.
                self._log.warning("%s %s: %s", request.method, request.path, err)
                response = problem_response(
                    503, _unavailable(err), instance=request.path, headers={"Retry-After": _RETRY_AFTER}
                )
            except Exception:
                self._log.exception("unhandled error serving %s %s", request.method, request.path)
                response = problem_response(
                    500, "internal error; the server log has the details", instance=request.path
                )
            status = response.status
            request_id = response.headers.get(REQUEST_ID_HEADER)
            return response
        finally:
            self._inflight.exit(HTTP_REQUEST)
            resource = request.match_info.route.resource
            route = resource.canonical if resource is not None else "UNKNOWN"
            seconds = time.perf_counter() - started
            self._requests.inc(method=request.method, route=route, status=str(status))
            self._latency.observe(seconds, method=request.method, route=route)
            if self._access_share and random.random() < self._access_share:
                self._log_access(request, route, status, seconds, request_id)

    def _log_access(
        self, request: web.Request, route: str, status: int, seconds: float, request_id: str | None
    ) -> None:
        """One access log line; the query string is left out (it may carry credentials)."""
        fields: dict[str, object] = {
            "method": request.method,
            "path": request.path,
            "route": route,
            "status": status,
            "duration_ms": round(seconds * 1000, 3),
            "remote": request.remote or "",
        }
        if request_id:
            fields["request_id"] = request_id
        self._access.info(
            "%s %s %d %.2fms %s", request.method, request.path, status, seconds * 1000, fields["remote"], extra=fields
        )

    async def start(self) -> int:
        """Bind and serve; returns the bound port."""
        # A client that hangs up cancels its handler: an invocation must stop (and cancel its request)
        # when the caller is gone, not run on for nobody.
        self._runner = ProblemAppRunner(
            self.app, access_log=None, handle_signals=False, shutdown_timeout=1.0, handler_cancellation=True
        )
        await self._runner.setup()
        self._site = web.TCPSite(
            self._runner, self._settings.host, self._settings.port, reuse_address=True, ssl_context=self._ssl
        )
        try:
            await self._site.start()
        except OSError as err:
            await self._runner.cleanup()
            hint = " (set http.port, or 0 for a free port)" if err.errno in (48, 98) else ""
            raise HttpServerError(
                f"cannot listen on {self._settings.host}:{self._settings.port}: {err.strerror or err}{hint}"
            ) from err
        addresses = self._runner.addresses
        self.port = int(addresses[0][1]) if addresses else self._settings.port
        return self.port

    async def stop_accepting(self) -> None:
        """Close the listening socket; connections already open keep being served."""
        if self._site is not None:
            await self._site.stop()
            self._site = None

    async def close(self) -> None:
        """Close every connection and free the runner."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


#: Seconds a caller is asked to wait after a 503 for a full store or an unreachable bus.
_RETRY_AFTER = "30"


def _unavailable(err: BusError) -> str:
    if isinstance(err, StoreFull):
        return (
            "the platform's message store is full, so nothing more can be accepted until queued requests, "
            "results or payloads are taken out or expire; operators: raise embedded_nats.max_file_store "
            "(or the NATS server's JetStream max_file_store) or free space"
        )
    return "the platform's message bus did not answer in time; retry shortly"
