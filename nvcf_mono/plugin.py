"""The plugin contract: a frozen spec, a sync ``setup()`` that declares, an async ``run()`` that serves.

A plugin class is registered under the ``nvcf_mono.plugins`` entry-point group with its spec's name.
The host builds it with its structured config (``plugins.<name>`` in the config), calls ``setup()``
once with a :class:`SetupContext` (no I/O: declare routes, gRPC services, streams, buckets, services),
then runs ``run()`` with a :class:`RunContext` inside the host's task group. ``run()`` opens what it
needs with ``async with``, calls ``task_status.started()`` when it serves, and returns only when the
host stops (or is cancelled). Raise :class:`PluginNotReady` before ``started()`` to be retried with
backoff, :class:`PluginConfigError` from ``setup()`` for bad config; anything else stops the host.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, ClassVar, Generic, Protocol, TypeVar, final

import attrs
from aiohttp import web
from anyio.abc import TaskStatus

from nvcf_mono.bus.api import BucketSpec, Bus, ObjectStoreSpec, StreamSpec
from nvcf_mono.config.model import Settings
from nvcf_mono.errors import NvcfMonoError
from nvcf_mono.lifecycle import InflightTracker
from nvcf_mono.metrics import Metrics
from nvcf_mono.services import ExtensionPoint, ServiceKey, ServiceRegistry

T = TypeVar("T")
C = TypeVar("C")

#: The roles every installation knows; plugins may name more in their spec.
BUILTIN_ROLES = ("all-in-one", "control", "invocation", "compute", "custom")
#: The plugins that serve the management API and the invocation API (endpoints.json says where they are).
CONTROL_PLANE = "control"
INVOCATION_PLANE = "invocation"


class PluginNotReady(NvcfMonoError):
    """Raised from ``run()`` before ``started()``: try again later (a dependency is not up yet)."""


class PluginConfigError(NvcfMonoError):
    """Raised from ``setup()`` when the plugin's configuration cannot work; the host does not start."""


@attrs.frozen(kw_only=True)
class NoConfig:
    """The config type of a plugin without settings."""


@final
@attrs.frozen(kw_only=True)
class PluginSpec:
    """What the host needs to know about a plugin before it builds it."""

    name: str
    description: str
    roles: frozenset[str] = frozenset()
    requires: tuple[str, ...] = ()
    after: tuple[str, ...] = ()
    config_type: type[Any] = NoConfig
    sections: Mapping[str, Any] = attrs.field(factory=dict)

    # name: entry-point name and config key (plugins.<name>); letters, digits, '_'
    # roles: the role presets that enable this plugin
    # requires: plugins that must be enabled and running before this one starts
    # after: plugins that, when enabled, start before this one
    # config_type: attrs-frozen class for plugins.<name>
    # sections: top-level config keys this plugin owns, and their types (e.g. {"images": ...})


class Plugin(Protocol):
    """What the host calls. See the module docstring for the contract."""

    spec: ClassVar[PluginSpec]

    def __init__(self, config: Any) -> None: ...

    def setup(self, ctx: SetupContext) -> None:
        """Declare what the plugin contributes. Synchronous; no I/O."""
        ...

    async def run(self, ctx: RunContext[Any], *, task_status: TaskStatus[None]) -> None:
        """Serve until the host stops; call ``task_status.started()`` once serving."""
        ...


@final
@attrs.frozen(kw_only=True)
class Route:
    """One HTTP route a plugin contributes."""

    owner: str
    method: str
    path: str
    handler: Callable[[web.Request], Any]
    name: str | None = None
    #: A GET route answers HEAD too (RFC 9110 asks it of every server); off for a GET that changes
    #: something (a result handed out once), where a HEAD would lose what it fetched.
    head: bool = True


#: Sees each HTTP response just before its head is sent (:meth:`SetupContext.add_response_hook`).
ResponseHook = Callable[[web.Request, web.StreamResponse], None]


@final
@attrs.define
class Contributions:
    """Everything plugins declared in ``setup()``; frozen before the host does any I/O."""

    routes: list[Route] = attrs.field(factory=list)
    middlewares: list[tuple[str, int, Any]] = attrs.field(factory=list)
    response_hooks: list[tuple[str, ResponseHook]] = attrs.field(factory=list)
    servicers: list[tuple[str, Any]] = attrs.field(factory=list)
    streams: dict[str, tuple[str, StreamSpec]] = attrs.field(factory=dict)
    buckets: dict[str, tuple[str, BucketSpec]] = attrs.field(factory=dict)
    object_stores: dict[str, tuple[str, ObjectStoreSpec]] = attrs.field(factory=dict)
    frozen: bool = False

    def check_open(self) -> None:
        if self.frozen:
            raise RuntimeError("contributions can only be declared during setup()")


def _declare(table: dict[str, tuple[str, Any]], kind: str, owner: str, name: str, spec: Any) -> None:
    existing = table.get(name)
    if existing is not None and existing[1] != spec:
        raise PluginConfigError(f"{kind} {name!r} is declared differently by plugins {existing[0]!r} and {owner!r}")
    table.setdefault(name, (owner, spec))


@final
class SetupContext:
    """Handed to ``setup()``: declare routes, services, streams; read config. No I/O happens here."""

    def __init__(
        self,
        *,
        name: str,
        settings: Settings,
        sections: Mapping[str, Any],
        contributions: Contributions,
        services: ServiceRegistry,
        metrics: Metrics,
        log: logging.Logger,
    ) -> None:
        self.name = name
        self.settings = settings
        self.metrics = metrics
        self.log = log
        self._sections = sections
        self._contrib = contributions
        self._services = services

    def section(self, key: str) -> Any:
        """The structured value of a top-level config section this plugin owns (spec.sections)."""
        return self._sections[key]

    def add_route(
        self,
        method: str,
        path: str,
        handler: Callable[[web.Request], Any],
        *,
        name: str | None = None,
        head: bool = True,
    ) -> None:
        """Serve ``method path`` (a GET also for HEAD unless ``head`` is false); until this plugin is
        running the route answers 503.
        """
        self._contrib.check_open()
        self._contrib.routes.append(
            Route(owner=self.name, method=method.upper(), path=path, handler=handler, name=name, head=head)
        )

    def add_routes(self, routes: Iterable[web.RouteDef | web.AbstractRouteDef]) -> None:
        """Serve every route of an aiohttp ``RouteTableDef``."""
        for route in routes:
            if not isinstance(route, web.RouteDef):
                raise PluginConfigError(f"plugin {self.name!r}: only plain routes are supported, got {route!r}")
            self.add_route(route.method, route.path, route.handler, name=route.kwargs.get("name"))

    def add_middleware(self, middleware: Any, *, order: int = 0) -> None:
        """Add an aiohttp middleware (lower ``order`` runs first); skipped until this plugin runs."""
        self._contrib.check_open()
        self._contrib.middlewares.append((self.name, order, middleware))

    def add_response_hook(self, hook: ResponseHook) -> None:
        """Call ``hook(request, response)`` as each HTTP response's head is about to be sent (answers,
        streams and error documents alike, so it may still set headers); skipped until this plugin runs.
        """
        self._contrib.check_open()
        self._contrib.response_hooks.append((self.name, hook))

    def add_servicer(self, servicer: Any) -> None:
        """Serve a grpclib servicer (anything with ``__mapping__``) on the host's gRPC port."""
        self._contrib.check_open()
        if not hasattr(servicer, "__mapping__"):
            raise PluginConfigError(f"plugin {self.name!r}: {servicer!r} is not a grpclib servicer")
        self._contrib.servicers.append((self.name, servicer))

    def declare_stream(self, spec: StreamSpec) -> None:
        """A stream the host ensures before any plugin runs."""
        self._contrib.check_open()
        _declare(self._contrib.streams, "stream", self.name, spec.name, spec)

    def declare_bucket(self, spec: BucketSpec) -> None:
        """A KV bucket the host ensures before any plugin runs."""
        self._contrib.check_open()
        _declare(self._contrib.buckets, "bucket", self.name, spec.name, spec)

    def declare_object_store(self, spec: ObjectStoreSpec) -> None:
        """An object store the host ensures before any plugin runs."""
        self._contrib.check_open()
        _declare(self._contrib.object_stores, "object store", self.name, spec.name, spec)

    def provide(self, key: ServiceKey[T], value: T) -> None:
        """Offer a service to other plugins."""
        self._services.provide(key, value, owner=self.name)

    def extend(self, point: ExtensionPoint[T], value: T) -> None:
        """Contribute to an extension point."""
        self._services.extend(point, value, owner=self.name)


@final
@attrs.frozen(kw_only=True)
class Endpoints:
    """Where this host can be reached, and where clients find each plane; known before any plugin runs."""

    #: This node's HTTP server and gRPC port.
    url: str
    grpc_address: str
    nats_url: str
    #: The management API, the invocation API and its gRPC port: this node where it runs the plane, else
    #: the deployment's other nodes (``peers.*``), else unknown.
    api_url: str | None = None
    invocation_url: str | None = None
    invocation_grpc_address: str | None = None
    #: The gRPC port speaks TLS (the HTTP port too: both or neither).
    tls: bool = False
    #: What clients should trust for them (None: the system's CAs).
    ca_file: str | None = None


class HostHandle(Protocol):
    """The part of the host a RunContext delegates to."""

    @property
    def stopping(self) -> bool: ...

    async def wait_stopping(self) -> None: ...

    def set_credential(self, key: str, value: str) -> None: ...

    def is_running(self, name: str) -> bool: ...


@final
class RunContext(Generic[C]):
    """Handed to ``run()``: the bus, shared services, metrics, and the host's lifecycle."""

    def __init__(
        self,
        *,
        name: str,
        config: C,
        settings: Settings,
        bus: Bus,
        services: ServiceRegistry,
        metrics: Metrics,
        log: logging.Logger,
        endpoints: Endpoints,
        inflight: InflightTracker,
        host: HostHandle,
    ) -> None:
        self.name = name
        self.config = config
        self.settings = settings
        self.bus = bus
        self.services = services
        self.metrics = metrics
        self.log = log
        self.endpoints = endpoints
        self._inflight = inflight
        self._host = host

    @property
    def state_dir(self) -> Path:
        """The plugin's own directory under the state directory (created on first use)."""
        # Absolute: paths under it are handed to child processes that run in other directories.
        path = self.settings.state_dir.absolute() / "plugins" / self.name
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        return path

    @property
    def stopping(self) -> bool:
        """True once the host has begun to shut down: take no new work."""
        return self._host.stopping

    async def wait_stopping(self) -> None:
        """Return when the host begins to shut down."""
        await self._host.wait_stopping()

    @contextmanager
    def track(self) -> Iterator[None]:
        """Count the block as in-flight work that shutdown waits for (up to its drain grace)."""
        with self._inflight.track():
            yield

    @asynccontextmanager
    async def when_stopping(self) -> AsyncIterator[None]:
        """Wait until the host begins to stop, then run the block as work its drain waits for.

        Counted from the moment stopping begins, so the drain waits for it even when nothing else is in
        flight (``track()`` entered after ``wait_stopping()`` can come too late for that).
        """
        reservation = self._inflight.reserve()
        try:
            await self.wait_stopping()
            yield
        finally:
            reservation.release()

    def set_credential(self, key: str, value: str) -> None:
        """Publish a credential in ``endpoints.json`` (e.g. ``admin_token``)."""
        self._host.set_credential(key, value)

    def plugin_running(self, name: str) -> bool:
        """Has the plugin ``name`` started (and not stopped)? False for one that is not enabled."""
        return self._host.is_running(name)


async def serve_forever(ctx: RunContext[Any], *, task_status: TaskStatus[None]) -> None:
    """A ``run()`` body for plugins that only contribute declarations: ready at once, wait for stop."""
    task_status.started()
    await ctx.wait_stopping()


class BasePlugin(Generic[C]):
    """Optional base: keeps the config, declares nothing, and serves until the host stops.

    Subclasses set ``spec`` and override ``setup()`` and/or ``run()``.
    """

    spec: ClassVar[PluginSpec]

    def __init__(self, config: C) -> None:
        self.config = config

    def setup(self, ctx: SetupContext) -> None:
        """Declare nothing."""

    async def run(self, ctx: RunContext[C], *, task_status: TaskStatus[None]) -> None:
        """Ready at once; return when the host stops."""
        await serve_forever(ctx, task_status=task_status)
