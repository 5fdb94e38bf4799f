"""The host: builds enabled plugins, runs them in dependency order in one task group, stops in stages.

Start: lock the state directory; start the embedded nats-server (when no ``bus.url``); connect the
bus; ensure declared streams, buckets and object stores; bind HTTP and gRPC (plugin routes answer 503
until their plugin runs); start plugins in order, retrying ``PluginNotReady`` with backoff and jitter;
write ``endpoints.json``; ready.

Stop (``request_shutdown()``, first SIGTERM): stop accepting connections and mark not ready; tell
plugins (``ctx.wait_stopping()``); wait for in-flight work up to ``shutdown.drain_grace``; stop
plugins in reverse order, each within ``shutdown.plugin_grace``; close HTTP and gRPC; drain the bus;
stop the embedded nats-server last. A plugin that fails while running stops the host the same way
(without the drain) and :meth:`Host.serve` raises :class:`HostFailed`.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from functools import partial
from typing import Any, final

import anyio
import attrs
from aiohttp import web
from anyio.abc import TaskGroup, TaskStatus

from nvcf_mono import tracing
from nvcf_mono.backoff import Backoff
from nvcf_mono.bus.api import Bus, ConnectionState
from nvcf_mono.bus.embedded import EmbeddedInfo, EmbeddedNats
from nvcf_mono.bus.errors import BusError, BusUnavailable, RequestTimeout
from nvcf_mono.bus.nats import NatsBus, open_nats_bus
from nvcf_mono.config.load import PluginEntry, ResolvedConfig
from nvcf_mono.errors import NvcfMonoError
from nvcf_mono.grpc.health import HealthServicer
from nvcf_mono.grpc.server import GrpcServer
from nvcf_mono.http.elsewhere import route_hint
from nvcf_mono.http.server import HttpServer
from nvcf_mono.lifecycle import InflightTracker, PluginState
from nvcf_mono.log import plugin_logger
from nvcf_mono.metrics import CONTENT_TYPE, Metrics
from nvcf_mono.plugin import (
    CONTROL_PLANE,
    INVOCATION_PLANE,
    Contributions,
    Endpoints,
    Plugin,
    PluginConfigError,
    PluginNotReady,
    RunContext,
    SetupContext,
)
from nvcf_mono.services import ServiceRegistry
from nvcf_mono.state_dir import ENDPOINTS_FILE, lock_state_dir, write_private
from nvcf_mono.tls import ServerTls, TlsError, server_tls

ENDPOINTS_VERSION = 1
CREDENTIAL_KEYS = ("admin_token", "api_key", "task_api_key")

log = logging.getLogger("nvcf_mono.host")


class HostSetupError(NvcfMonoError):
    """Plugins could not be built or set up; ``problems`` has one line each."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = tuple(problems)
        super().__init__("\n".join(self.problems))


class PluginFailed(NvcfMonoError):
    """A plugin raised while starting or running."""

    def __init__(self, name: str, reason: str) -> None:
        self.plugin = name
        super().__init__(f"plugin {name!r} failed: {reason}")


class HostFailed(NvcfMonoError):
    """The host stopped because something failed; the cause is chained."""


@attrs.define(eq=False)
class _Loaded:
    entry: PluginEntry
    instance: Plugin
    log: logging.Logger
    state: PluginState = PluginState.PENDING
    reason: str = ""
    scope: anyio.CancelScope | None = None
    done: anyio.Event = attrs.field(factory=anyio.Event)
    started: bool = False

    @property
    def name(self) -> str:
        return self.entry.name


class _StartedFlag:
    """Wraps a plugin's task_status so the host knows whether ``started()`` was called."""

    def __init__(self, inner: TaskStatus[None], loaded: _Loaded) -> None:
        self._inner = inner
        self._loaded = loaded

    def started(self, value: None = None) -> None:
        self._loaded.started = True
        self._inner.started(value)


@final
class Host:
    """Build with a resolved config (plugins are set up here, before any I/O), then ``await serve()``."""

    def __init__(self, config: ResolvedConfig) -> None:
        self.config = config
        self.settings = config.settings
        self.metrics = Metrics()
        self.services = ServiceRegistry()
        self.contributions = Contributions()
        self.inflight = InflightTracker()
        self.node_id = self.settings.node.id or socket.gethostname().split(".")[0] or "nvcf-mono"
        self._plugins: list[_Loaded] = []
        self._by_name: dict[str, _Loaded] = {}
        self._shutdown = anyio.Event()
        self._stopping = anyio.Event()
        self._startup_scope: anyio.CancelScope | None = None
        self._ready = False
        self._credentials: dict[str, str | None] = dict.fromkeys(CREDENTIAL_KEYS)
        self._endpoints: Endpoints | None = None
        self._endpoints_written = False
        self._bus: NatsBus | None = None
        #: The HTTP server once bound (tests read its routes).
        self.http: HttpServer | None = None
        self.embedded: EmbeddedNats | None = None
        self._health = HealthServicer(self._service_status)
        self._plugin_state = self.metrics.gauge("plugin_up", "1 while the plugin runs.", ["plugin"])
        self._ready_gauge = self.metrics.gauge("host_ready", "1 while every enabled plugin runs.")
        self._ready_gauge.set_function(lambda: [((), 1.0 if self.ready else 0.0)])
        self._setup_plugins()

    # ---- building ---------------------------------------------------------------------------------

    def _setup_plugins(self) -> None:
        problems: list[str] = []
        for entry in self.config.enabled:
            plog = plugin_logger(entry.name)
            try:
                instance = entry.cls(entry.config)
                loaded = _Loaded(entry=entry, instance=instance, log=plog)
                instance.setup(
                    SetupContext(
                        name=entry.name,
                        settings=self.settings,
                        sections=self.config.sections,
                        contributions=self.contributions,
                        services=self.services,
                        metrics=self.metrics,
                        log=plog,
                    )
                )
            except PluginConfigError as err:
                problems.append(f"plugins.{entry.name}: {err}")
                continue
            except NvcfMonoError as err:
                problems.append(f"plugins.{entry.name}: setup failed: {err}")
                continue
            except Exception as err:
                log.exception("setup() of plugin %s raised", entry.name)
                problems.append(f"plugins.{entry.name}: setup() raised {type(err).__name__}: {err}")
                continue
            self._plugins.append(loaded)
            self._by_name[entry.name] = loaded
        if problems:
            raise HostSetupError(problems)
        self.contributions.frozen = True
        self.services.freeze()
        if self.settings.bus.url is None:
            self.embedded = EmbeddedNats(
                self.settings.embedded_nats,
                self.settings.state_dir,
                metrics=self.metrics,
                log=logging.getLogger("nvcf_mono.bus.embedded"),
            )

    # ---- state -------------------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        """Every enabled plugin runs, the bus is connected, and the host is not stopping."""
        return (
            self._ready
            and not self._stopping.is_set()
            and self._bus is not None
            and self._bus.state is ConnectionState.CONNECTED
        )

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    async def wait_stopping(self) -> None:
        await self._stopping.wait()

    @property
    def endpoints(self) -> Endpoints:
        """Where the host listens (known once serve() has bound its ports)."""
        if self._endpoints is None:
            raise RuntimeError("the host has not bound its ports yet")
        return self._endpoints

    @property
    def bus(self) -> Bus:
        if self._bus is None:
            raise RuntimeError("the bus is not connected yet")
        return self._bus

    def plugin_state(self, name: str) -> PluginState:
        return self._by_name[name].state

    def plugin(self, name: str) -> Plugin:
        """The instance of plugin ``name``, for tests and tools that look inside it (KeyError when not loaded)."""
        return self._by_name[name].instance

    def is_running(self, name: str) -> bool:
        loaded = self._by_name.get(name)
        return loaded is not None and loaded.state is PluginState.RUNNING

    def _service_status(self, service: str) -> bool | None:
        if service == "":
            return self.ready
        loaded = self._by_name.get(service)
        return None if loaded is None else loaded.state is PluginState.RUNNING

    def _set_state(self, loaded: _Loaded, state: PluginState, reason: str = "") -> None:
        loaded.state = state
        loaded.reason = reason
        self._plugin_state.set(1.0 if state is PluginState.RUNNING else 0.0, plugin=loaded.name)
        self._health.notify()

    def set_credential(self, key: str, value: str) -> None:
        """Record a credential for endpoints.json (rewritten at once when already written)."""
        self._credentials[key] = value
        if self._endpoints_written:
            self._write_endpoints()

    def request_shutdown(self) -> None:
        """Begin the staged shutdown (safe to call more than once, and before start)."""
        self._shutdown.set()
        if self._startup_scope is not None:
            self._startup_scope.cancel()

    # ---- HTTP endpoints of the host itself ----------------------------------------------------------

    def _readiness(self) -> dict[str, Any]:
        bus = self._bus.state.value if self._bus is not None else "connecting"
        if self.ready:
            status = "ready"
        elif self.stopping:
            status = "stopping"
        elif self._ready:
            status = "reconnecting"  # was ready; the bus connection is being re-established
        else:
            status = "starting"
        return {
            "status": status,
            "role": self.settings.role,
            "node": self.node_id,
            "bus": bus,
            "plugins": {
                p.name: ({"state": p.state.value, "reason": p.reason} if p.reason else {"state": p.state.value})
                for p in self._plugins
            },
        }

    async def _health_route(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "OK"})

    async def _ready_route(self, request: web.Request) -> web.Response:
        return web.json_response(self._readiness(), status=200 if self.ready else 503)

    async def _metrics_route(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render().encode(), headers={"Content-Type": CONTENT_TYPE})

    # ---- serving -----------------------------------------------------------------------------------

    async def serve(self, *, task_status: TaskStatus[Endpoints] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run until shutdown; raises :class:`HostFailed` if a plugin or the bus failed."""
        started_at = time.monotonic()
        try:
            with lock_state_dir(self.settings.state_dir):
                await self._serve(started_at, task_status)
        except BaseExceptionGroup as group:
            failures = _leaves(group)
            cancelled = anyio.get_cancelled_exc_class()
            real = [e for e in failures if not isinstance(e, cancelled)]
            if not real:
                raise
            for err in real[1:]:
                log.error("also failed: %s", err)
            raise HostFailed(str(real[0])) from real[0]
        except (PluginFailed, BusError, TlsError, tracing.TracingUnavailable) as err:
            raise HostFailed(str(err)) from err

    async def _serve(self, started_at: float, task_status: TaskStatus[Endpoints]) -> None:
        s = self.settings
        async with AsyncExitStack() as stack:
            infra = await stack.enter_async_context(anyio.create_task_group())
            # Runs after everything entered below has closed (the bus included), so the server stops last.
            stack.callback(self._stop_infra, infra)
            if s.tracing.otlp_endpoint:
                tracing.setup(
                    [tracing.OtlpTarget.at(s.tracing.otlp_endpoint, "traces")],
                    s.tracing.service_name,
                    sample=s.tracing.sample,
                    export_delay=s.tracing.export_delay,
                    resource={"service.instance.id": self.node_id},
                )
                # Last of all: what the stop itself traced goes out too (a thread: the export blocks).
                stack.push_async_callback(_shielded, _stop_tracing, s.shutdown.plugin_grace)
            embedded: EmbeddedInfo | None = None
            if self.embedded is not None:
                embedded = await infra.start(self.embedded.serve, name="host:embedded-nats")
                servers = [embedded.client_url]
            else:
                servers = [u.strip() for u in (s.bus.url or "").split(",") if u.strip()]
            bus = await stack.enter_async_context(
                open_nats_bus(
                    s.bus,
                    servers=servers,
                    name=f"nvcf-mono:{self.node_id}",
                    metrics=self.metrics,
                    log=logging.getLogger("nvcf_mono.bus"),
                )
            )
            self._bus = bus
            infra.start_soon(self._follow_bus, bus, name="host:bus-events")
            await self._ensure_declared(bus)

            http, grpc, tls = await self._listen(stack, infra)
            self._endpoints = self._make_endpoints(http.port, grpc.port, embedded, servers, tls)

            async with anyio.create_task_group() as tg:
                with anyio.CancelScope() as startup:
                    self._startup_scope = startup
                    if self._shutdown.is_set():
                        startup.cancel()
                    for loaded in self._plugins:
                        await self._start_plugin(tg, loaded, bus)
                self._startup_scope = None
                if not startup.cancelled_caught:
                    self._ready = True
                    self._health.notify()
                    self._write_endpoints()
                    log.info(
                        "ready in %.2fs: role %s, plugins %s",
                        time.monotonic() - started_at,
                        s.role,
                        ", ".join(p.name for p in self._plugins) or "none",
                    )
                    task_status.started(self._endpoints)
                    await self._shutdown.wait()
                await self._drain(http, grpc)
                await self._stop_plugins()
                tg.cancel_scope.cancel()
        log.info("stopped")

    async def _listen(self, stack: AsyncExitStack, infra: TaskGroup) -> tuple[HttpServer, GrpcServer, ServerTls | None]:
        """Start the HTTP and gRPC servers (over TLS when configured); closed when ``stack`` unwinds."""
        s = self.settings
        tls = await anyio.to_thread.run_sync(server_tls, s.tls, s.state_dir, self._tls_names())
        if tls is not None:
            infra.start_soon(tls.watch, s.tls.reload_interval, name="host:tls-reload")
        http = HttpServer(
            s.http,
            self.contributions,
            host_routes=[
                ("GET", "/health", self._health_route),
                ("GET", "/ready", self._ready_route),
                ("GET", "/metrics", self._metrics_route),
            ],
            is_running=self.is_running,
            inflight=self.inflight,
            metrics=self.metrics,
            log=logging.getLogger("nvcf_mono.http"),
            ssl_context=tls.http if tls is not None else None,
            access_log=s.logging.access_log,
            route_hint=route_hint(s.role, self.config.order, lambda: self._endpoints),
        )
        self.http = http
        await http.start()
        stack.push_async_callback(_shielded, http.close, s.shutdown.plugin_grace)
        grpc = GrpcServer(
            s.grpc,
            [("host", self._health), *self.contributions.servicers],
            is_running=self.is_running,
            inflight=self.inflight,
            metrics=self.metrics,
            log=logging.getLogger("nvcf_mono.grpc"),
        )
        await grpc.start(tls.grpc if tls is not None else None)
        stack.push_async_callback(_shielded, grpc.close, s.shutdown.plugin_grace)
        return http, grpc, tls

    async def _follow_bus(self, bus: NatsBus) -> None:
        """Wake gRPC health watchers when the connection (and so readiness) changes."""
        async with bus.events() as events:
            async for _ in events:
                self._health.notify()

    def _stop_infra(self, infra: TaskGroup) -> None:
        if self.embedded is not None:
            self.embedded.stop()
        infra.cancel_scope.cancel()

    def _tls_names(self) -> list[str]:
        """The names a development certificate covers: the listen addresses and the public ones."""
        s = self.settings
        names = [s.http.host, s.grpc.host]
        if s.http.public_url:
            names.append(s.http.public_url.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)[0].strip("[]"))
        if s.grpc.public_address:
            names.append(s.grpc.public_address.rsplit(":", 1)[0].strip("[]"))
        return names

    def _make_endpoints(
        self,
        http_port: int,
        grpc_port: int,
        embedded: EmbeddedInfo | None,
        servers: list[str],
        tls: ServerTls | None = None,
    ) -> Endpoints:
        s = self.settings
        http_host = "127.0.0.1" if s.http.host in ("0.0.0.0", "::", "") else s.http.host
        grpc_host = "127.0.0.1" if s.grpc.host in ("0.0.0.0", "::", "") else s.grpc.host
        scheme = "https" if tls is not None else "http"
        base = s.http.public_url or f"{scheme}://{http_host}:{http_port}"
        nats_url = embedded.client_url if embedded is not None else ",".join(servers)
        ca = tls.files.ca if tls is not None else None
        runs = set(self.config.order)
        grpc_address = s.grpc.public_address or f"{grpc_host}:{grpc_port}"
        return Endpoints(
            url=base,
            grpc_address=grpc_address,
            nats_url=nats_url,
            tls=tls is not None,
            ca_file=str(ca) if ca is not None else None,
            api_url=base if CONTROL_PLANE in runs else s.peers.api_url,
            invocation_url=base if INVOCATION_PLANE in runs else s.peers.invocation_url,
            invocation_grpc_address=grpc_address if INVOCATION_PLANE in runs else s.peers.invocation_grpc_address,
        )

    def _write_endpoints(self) -> None:
        ep = self.endpoints
        doc = {
            "version": ENDPOINTS_VERSION,
            "role": self.settings.role,
            "node_url": ep.url,
            "api_url": ep.api_url,
            "invocation_url": ep.invocation_url,
            "grpc_url": ep.invocation_grpc_address,
            "grpc_tls": ep.tls,
            # Absolute: the file is read by clients in other directories (`--state-dir`).
            "ca_file": os.path.abspath(ep.ca_file) if ep.ca_file else None,
            "nats_url": ep.nats_url,
            "credentials": dict(self._credentials),
        }
        write_private(self.settings.state_dir / ENDPOINTS_FILE, (json.dumps(doc, indent=2) + "\n").encode())
        self._endpoints_written = True

    async def _ensure_declared(self, bus: NatsBus) -> None:
        c = self.contributions
        deadline = time.monotonic() + self.settings.startup.timeout
        backoff = Backoff(0.1, 2.0)
        declarations: list[Callable[[], Awaitable[object]]] = [
            *(partial(bus.ensure_stream, spec) for _, spec in c.streams.values()),
            *(partial(bus.ensure_bucket, bucket) for _, bucket in c.buckets.values()),
            *(partial(bus.ensure_object_store, store) for _, store in c.object_stores.values()),
        ]
        while True:
            try:
                await _all_at_once(declarations)
                return
            except (BusUnavailable, RequestTimeout) as err:
                # JetStream may still be recovering its store after a restart; anything else is fatal.
                pause = backoff.next()
                if time.monotonic() + pause > deadline:
                    raise
                log.info("JetStream not ready yet (%s); retrying", err)
                await anyio.sleep(pause)

    async def _start_plugin(self, tg: TaskGroup, loaded: _Loaded, bus: Bus) -> None:
        startup = self.settings.startup
        deadline = time.monotonic() + startup.timeout
        backoff = Backoff(startup.retry_initial, startup.retry_max)
        attempt = 0
        ctx: RunContext[Any] = RunContext(
            name=loaded.name,
            config=loaded.entry.config,
            settings=self.settings,
            bus=bus,
            services=self.services,
            metrics=self.metrics,
            log=loaded.log,
            endpoints=self.endpoints,
            inflight=self.inflight,
            host=self,
        )
        while True:
            attempt += 1
            self._set_state(loaded, PluginState.STARTING)
            loaded.done = anyio.Event()
            watch = anyio.CancelScope()
            tg.start_soon(self._warn_if_slow, loaded, watch, name=f"host:watch:{loaded.name}")
            try:
                await tg.start(self._run_plugin, loaded, ctx, name=f"plugin:{loaded.name}")
            except PluginNotReady as err:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self._set_state(loaded, PluginState.FAILED, str(err))
                    raise PluginFailed(loaded.name, f"still not ready after {startup.timeout:g}s: {err}") from err
                pause = min(backoff.next(), remaining)
                self._set_state(loaded, PluginState.RETRYING, str(err))
                loaded.log.warning("not ready (%s); retrying in %.1fs (attempt %d)", err, pause, attempt)
                await anyio.sleep(pause)
                continue
            finally:
                watch.cancel()
            self._set_state(loaded, PluginState.RUNNING)
            loaded.log.debug("running")
            return

    async def _warn_if_slow(self, loaded: _Loaded, scope: anyio.CancelScope) -> None:
        with scope:
            await anyio.sleep(self.settings.startup.slow_warning)
            loaded.log.warning("still starting after %gs", self.settings.startup.slow_warning)

    async def _run_plugin(self, loaded: _Loaded, ctx: RunContext[Any], *, task_status: TaskStatus[None]) -> None:
        loaded.started = False
        flag = _StartedFlag(task_status, loaded)
        try:
            with anyio.CancelScope() as scope:
                loaded.scope = scope
                try:
                    await loaded.instance.run(ctx, task_status=flag)
                except PluginNotReady as err:
                    if not loaded.started:
                        raise
                    self._set_state(loaded, PluginState.FAILED, str(err))
                    raise PluginFailed(loaded.name, f"raised PluginNotReady after it had started: {err}") from err
                except anyio.get_cancelled_exc_class():
                    raise
                except NvcfMonoError as err:
                    self._set_state(loaded, PluginState.FAILED, str(err))
                    # A bus outage or a configuration that cannot work says all in its message.
                    loaded.log.error("failed: %s", err, exc_info=not isinstance(err, BusError | PluginConfigError))
                    raise PluginFailed(loaded.name, str(err)) from err
                except Exception as err:
                    self._set_state(loaded, PluginState.FAILED, f"{type(err).__name__}: {err}")
                    loaded.log.exception("run() raised")
                    raise PluginFailed(loaded.name, f"{type(err).__name__}: {err}") from err
                if not loaded.started:
                    raise PluginFailed(loaded.name, "run() returned without calling task_status.started()")
                if not self._stopping.is_set():
                    self._set_state(loaded, PluginState.FAILED, "run() returned while the host was running")
                    raise PluginFailed(loaded.name, "run() returned while the host was running")
        finally:
            loaded.done.set()

    async def _drain(self, http: HttpServer, grpc: GrpcServer) -> None:
        grace = self.settings.shutdown.drain_grace
        self._stopping.set()
        self.inflight.claim_reserved()  # plugins' stop work (RunContext.when_stopping) counts from now
        if self.inflight.count:
            log.info(
                "draining: no new connections; waiting up to %gs for what is in flight: %s",
                grace,
                self.inflight.describe(),
            )
        else:
            log.info("draining: no new connections; nothing in flight")
        self._health.notify()
        with anyio.CancelScope(shield=True):
            await http.stop_accepting()
            await grpc.stop_accepting()
        with anyio.move_on_after(grace) as scope:  # not shielded: a second signal cuts the drain short
            await self.inflight.wait_idle()
        if scope.cancelled_caught:
            log.warning("still in flight after %gs, cancelling: %s", grace, self.inflight.describe())

    async def _stop_plugins(self) -> None:
        grace = self.settings.shutdown.plugin_grace
        for loaded in reversed(self._plugins):
            if loaded.state not in (PluginState.RUNNING, PluginState.STOPPING):
                continue
            self._set_state(loaded, PluginState.STOPPING)
            if not loaded.done.is_set() and loaded.scope is not None:
                loaded.scope.cancel()
            with anyio.move_on_after(grace, shield=True) as scope:
                await loaded.done.wait()
            if scope.cancelled_caught:
                loaded.log.error("did not stop within %gs of being cancelled", grace)
            self._set_state(loaded, PluginState.STOPPED)


async def _stop_tracing() -> None:
    await anyio.to_thread.run_sync(tracing.shutdown)


async def _shielded(fn: Any, timeout: float) -> None:
    with anyio.move_on_after(timeout, shield=True):
        await fn()


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    out: list[BaseException] = []
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            out.extend(_leaves(exc))
        else:
            out.append(exc)
    return out


async def _all_at_once(calls: Sequence[Callable[[], Awaitable[object]]]) -> None:
    """Run ``calls`` concurrently (each declaration is two round trips to JetStream, and a node declares
    some thirty: one after another they were most of a start); raise the first error, a fatal one before one
    worth retrying.
    """
    errors: list[Exception] = []

    async def run(call: Callable[[], Awaitable[object]]) -> None:
        try:
            await call()
        except Exception as err:  # kept for the caller, which decides whether to retry
            errors.append(err)

    async with anyio.create_task_group() as tg:
        for call in calls:
            tg.start_soon(run, call)
    if errors:
        errors.sort(key=lambda err: isinstance(err, (BusUnavailable, RequestTimeout)))
        raise errors[0]
