"""The invocation plane's plugin: NVCF invocation over a durable JetStream buffer, and the WorkerService.

Any number of invocation nodes may run: a request is answered by the node that holds the client,
served by whichever node holds a worker of its version, and its result (after a 202) is found by
a status poll on any node.
"""

from __future__ import annotations

from typing import ClassVar

import anyio
from anyio.abc import TaskStatus

from nvcf_mono.auth.secret import KEYRING
from nvcf_mono.auth.strategy import AUTHENTICATOR, Authenticator
from nvcf_mono.bus.api import ConnectionState
from nvcf_mono.bus.callout import NATS_AUTH
from nvcf_mono.bus.upload_room import upload_room
from nvcf_mono.contracts import buckets
from nvcf_mono.http.api import ApiRouter, Gatekeeper
from nvcf_mono.late import Late
from nvcf_mono.planes.invocation import cors, exec_api, host_routing, http
from nvcf_mono.planes.invocation.collector import Collector
from nvcf_mono.planes.invocation.config import InvocationConfig
from nvcf_mono.planes.invocation.dispatch import Dispatcher
from nvcf_mono.planes.invocation.grpc_proxy import GrpcProxy
from nvcf_mono.planes.invocation.handover import Handover
from nvcf_mono.planes.invocation.idempotency import Idempotency
from nvcf_mono.planes.invocation.input_assets import InputAssets
from nvcf_mono.planes.invocation.large_responses import LargeResponses
from nvcf_mono.planes.invocation.llm.gateway import CROSS_ORIGIN, Gateway, openai_route_errors
from nvcf_mono.planes.invocation.llm.sharing import LimitSharing
from nvcf_mono.planes.invocation.load import LoadMeter
from nvcf_mono.planes.invocation.metrics import InvocationMetrics
from nvcf_mono.planes.invocation.ratelimit import RateLimiter
from nvcf_mono.planes.invocation.relay import Relay
from nvcf_mono.planes.invocation.responses import Capabilities, ResponseRouter
from nvcf_mono.planes.invocation.results import ResultStore
from nvcf_mono.planes.invocation.retired import RetiredQueues
from nvcf_mono.planes.invocation.routing import RoutingTable
from nvcf_mono.planes.invocation.settlement import NodeSink
from nvcf_mono.planes.invocation.workers import WorkerDeps, WorkerService
from nvcf_mono.plugin import BasePlugin, PluginSpec, RunContext, SetupContext

BUCKETS = (
    buckets.FUNCTIONS,
    buckets.DEPLOYMENTS,
    buckets.AUTHORIZATIONS,
    buckets.PLACEMENTS,
    buckets.REQUESTS,
    buckets.RESULTS,
    buckets.IDEMPOTENCY,
    buckets.ASSETS,
    buckets.RATE_LIMITS,
)


class InvocationPlane(BasePlugin[InvocationConfig]):
    """Plugin ``invocation``."""

    spec: ClassVar[PluginSpec] = PluginSpec(
        name="invocation",
        description="Invocation plane: NVCF invocation over a durable JetStream buffer, and the WorkerService.",
        roles=frozenset({"all-in-one", "invocation"}),
        requires=("auth",),
        after=("auth_api_key", "auth_static_token", "auth_jwt", "auth_delegation", "nats_auth"),
        config_type=InvocationConfig,
    )

    def setup(self, ctx: SetupContext) -> None:
        for bucket in BUCKETS:
            ctx.declare_bucket(bucket)
        ctx.declare_object_store(buckets.PAYLOADS)
        ctx.declare_object_store(buckets.TASK_RESULT_CONTENT)  # task workers upload results through this node
        self.invoker: Late[http.Invoker] = Late("the invocation plane")
        self.router = ApiRouter()
        http.routes.bind(self.router, self.invoker)
        exec_api.routes.bind(self.router, self.invoker)
        self.router.install(ctx)
        self.authenticator: Late[Authenticator] = Late("authentication")
        ctx.add_middleware(host_routing.middleware(self.invoker.get, self.authenticator.get))
        self.metrics = InvocationMetrics(ctx.metrics)
        self.gateway: Gateway | None = None
        if self.config.llm_gateway.enabled:
            gateway = self.gateway = Gateway(
                self.config.llm_gateway, self.invoker, self.authenticator, ctx.metrics, ctx.log
            )
            for method, path, handler in gateway.routes():
                ctx.add_route(method, path, handler)
            ctx.add_middleware(openai_route_errors, order=2)  # innermost: sees the router's 404 and 405
        crossing = cors.Cors(CROSS_ORIGIN if self.gateway is not None else ())
        ctx.add_middleware(crossing.middleware(), order=1)  # inside host routing: never sees host-routed calls
        ctx.add_response_hook(crossing.on_response)
        self.workers = WorkerService(self.config, ctx.log)
        ctx.add_servicer(self.workers)
        # Calls to gRPC functions: every method the host does not serve itself.
        self.grpc_proxy = GrpcProxy(ctx.log, invoker=self.invoker, authenticator=self.authenticator)
        ctx.add_servicer(self.grpc_proxy)

    async def run(self, ctx: RunContext[InvocationConfig], *, task_status: TaskStatus[None]) -> None:
        bus, log = ctx.bus, ctx.log
        region = ctx.settings.node.region
        routing = RoutingTable(bus, log)
        capabilities = Capabilities.of_keyring(ctx.services.get(KEYRING))
        router = ResponseRouter(bus, ctx.settings.node.id or "invocation", log, capabilities)
        dispatcher = Dispatcher(bus, self.config, region, log, settings=ctx.settings, account_of=routing.account_of)
        results = ResultStore(bus, result_ttl=self.config.result_ttl, log=log, settings=ctx.settings)
        large = self._large_responses(ctx)
        collector = Collector(router=router, results=results, dispatcher=dispatcher, log=log)
        async with anyio.create_task_group() as tg:
            await tg.start(routing.run, bus)
            await tg.start(router.serve)
            await tg.start(results.waits.run)
            await tg.start(collector.run)
            assets = InputAssets(bus, log)
            await tg.start(assets.run, bus)
            tg.start_soon(self.metrics.refresh_queue_depth, bus, routing, dispatcher, log)
            node = ctx.settings.node.id or "invocation"
            limiter = RateLimiter.on_bus(bus, self.config, node=node, metrics=ctx.metrics, log=log)
            await tg.start(limiter.run)
            meter = LoadMeter(
                bus,
                node=node,
                interval=self.config.load_report_interval,
                sessions=lambda: list(self.workers.sessions.values()),
                placements=routing.placements_by_ids,
                log=log,
            )
            dispatcher.on_queued = meter.queued
            self.metrics.on_answer = meter.answered
            await tg.start(meter.run)
            relay = Relay(bus, router, log)
            sink = NodeSink(relay, results, dispatcher)
            retired = RetiredQueues(
                bus,
                routing=routing,
                dispatcher=dispatcher,
                answers=sink,
                interval=self.config.sweep_interval,
                grace=self.config.retired_queue_grace,
                log=log,
            )
            tg.start_soon(retired.run)
            if self.gateway is not None and self.gateway.limits.limited:
                await tg.start(LimitSharing(bus, self.gateway.limits, node, log).run)
            handover = Handover(bus, self.workers.affinity, ctx.metrics, log)
            await tg.start(handover.run, self.workers.take_handed)
            self.workers.deps.set(
                self._worker_deps(ctx, routing, dispatcher, sink, capabilities, handover=handover, large=large)
            )
            self.invoker.set(
                http.Invoker(
                    config=self.config,
                    routing=routing,
                    dispatcher=dispatcher,
                    router=router,
                    results=results,
                    adopt=collector.adopt,
                    limiter=limiter,
                    log=log,
                    assets=assets,
                    large_responses=large,
                    idempotency=Idempotency(
                        bus,
                        results,
                        ttl=self.config.idempotency_ttl,
                        record_ttl=self.config.queue_deadline + self.config.result_ttl,
                        region=region,
                        log=log,
                    ),
                    metrics=self.metrics,
                )
            )
            self.authenticator.set(ctx.services.get(AUTHENTICATOR))
            self.router.gatekeeper.set(Gatekeeper(ctx.services.get(AUTHENTICATOR)))
            if self.gateway is not None:
                self.gateway.unready.set(lambda: _why_not_ready(ctx))
            task_status.started()
            await self._through_the_drain(ctx)

    async def _through_the_drain(self, ctx: RunContext[InvocationConfig]) -> None:
        """Until the host cancels this plugin, after its drain.

        At the first signal the worker sessions leave: they take no more requests and end once what they
        hold is settled, so their workers go to other nodes. Everything else keeps running: the router
        brings the answers of this node's callers that workers on other nodes serve, the handover answers
        other nodes' offers, the result waits answer polls.
        """
        await ctx.wait_stopping()
        self.workers.leave()
        await anyio.sleep_forever()

    def _large_responses(self, ctx: RunContext[InvocationConfig]) -> LargeResponses:
        """Where zipped large responses are kept, and the base of their download links."""
        keyring = ctx.services.get(KEYRING)
        public = (self.config.public_url or ctx.endpoints.url).rstrip("/")
        return LargeResponses(
            ctx.bus.objects(buckets.PAYLOADS.name),
            link_key=lambda: keyring.asset_link_key,
            base_url=lambda: public,
            ttl=self.config.result_ttl,
            limit=self.config.max_large_response,
            room=upload_room(ctx.bus, ctx.settings),
        )

    def _worker_deps(
        self,
        ctx: RunContext[InvocationConfig],
        routing: RoutingTable,
        dispatcher: Dispatcher,
        sink: NodeSink,
        capabilities: Capabilities,
        *,
        handover: Handover,
        large: LargeResponses,
    ) -> WorkerDeps:
        """What the WorkerService and the NATS worker transport serve workers with."""
        return WorkerDeps(
            bus=ctx.bus,
            keyring=ctx.services.get(KEYRING),
            routing=routing,
            dispatcher=dispatcher,
            sink=sink,
            capabilities=capabilities,
            nats_url=self.config.worker_nats_url or _without_credentials(ctx.endpoints.nats_url),
            callout=ctx.services.find(NATS_AUTH),
            handover=handover,
            large_responses=large,
        )


def _without_credentials(urls: str) -> str:
    """``nats://user:pw@host:port,...`` -> ``nats://host:port,...`` (workers bring their own credential)."""
    return ",".join(
        f"{u.split('://', 1)[0]}://{u.split('://', 1)[1].rsplit('@', 1)[-1]}" if "://" in u else u.rsplit("@", 1)[-1]
        for u in urls.split(",")
    )


def _why_not_ready(ctx: RunContext[InvocationConfig]) -> str | None:
    """Why this node should get no new calls now, or None (the gateway's readiness probe)."""
    if ctx.stopping:
        return "this node is stopping"
    if ctx.bus.state is not ConnectionState.CONNECTED:
        return f"this node's bus connection is {ctx.bus.state.value}"
    return None
