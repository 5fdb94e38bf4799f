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
from nvcf_mono.auth.strategy import AUTHENTICATOR
from nvcf_mono.contracts import buckets
from nvcf_mono.http.api import ApiRouter
from nvcf_mono.http.problem import ProblemError
from nvcf_mono.planes.invocation import http
from nvcf_mono.planes.invocation.collector import Collector
from nvcf_mono.planes.invocation.config import InvocationConfig
from nvcf_mono.planes.invocation.dispatch import Dispatcher
from nvcf_mono.planes.invocation.ratelimit import RateLimiter
from nvcf_mono.planes.invocation.relay import Relay
from nvcf_mono.planes.invocation.responses import ResponseRouter
from nvcf_mono.planes.invocation.results import ResultStore
from nvcf_mono.planes.invocation.routing import RoutingTable
from nvcf_mono.planes.invocation.workers import WorkerService
from nvcf_mono.plugin import BasePlugin, PluginSpec, RunContext, SetupContext

BUCKETS = (
    buckets.FUNCTIONS,
    buckets.DEPLOYMENTS,
    buckets.AUTHORIZATIONS,
    buckets.PLACEMENTS,
    buckets.REQUESTS,
    buckets.RESULTS,
    buckets.IDEMPOTENCY,
)


class InvocationPlane(BasePlugin[InvocationConfig]):
    """Plugin ``invocation``."""

    spec: ClassVar[PluginSpec] = PluginSpec(
        name="invocation",
        description="Invocation plane: NVCF invocation over a durable JetStream buffer, and the WorkerService.",
        roles=frozenset({"all-in-one", "invocation"}),
        requires=("auth",),
        after=("auth_api_key", "auth_static_token", "auth_jwt"),
        config_type=InvocationConfig,
    )

    def setup(self, ctx: SetupContext) -> None:
        for bucket in BUCKETS:
            ctx.declare_bucket(bucket)
        ctx.declare_object_store(buckets.PAYLOADS)
        self._invoker: http.Invoker | None = None
        self.router = ApiRouter()
        http.register(self.router, self._get_invoker)
        self.router.install(ctx)
        self.workers = WorkerService(self.config, ctx.log)
        ctx.add_servicer(self.workers)

    def _get_invoker(self) -> http.Invoker:
        if self._invoker is None:
            raise ProblemError(503, "the invocation plane is starting", headers={"Retry-After": "1"})
        return self._invoker

    async def run(self, ctx: RunContext[InvocationConfig], *, task_status: TaskStatus[None]) -> None:
        bus, log = ctx.bus, ctx.log
        region = ctx.settings.node.region
        routing = RoutingTable(bus, log)
        router = ResponseRouter(bus, ctx.settings.node.id or "invocation", log)
        dispatcher = Dispatcher(bus, self.config, region, log)
        results = ResultStore(bus, result_ttl=self.config.result_ttl, log=log)
        collector = Collector(router=router, results=results, dispatcher=dispatcher, log=log)
        async with anyio.create_task_group() as tg:
            await tg.start(routing.run, bus)
            await tg.start(router.serve)
            await tg.start(collector.run)
            self.workers.bind(
                bus=bus,
                keyring=ctx.services.get(KEYRING),
                routing=routing,
                dispatcher=dispatcher,
                relay=Relay(bus, router, log),
                results=results,
            )
            self._invoker = http.Invoker(
                config=self.config,
                routing=routing,
                dispatcher=dispatcher,
                router=router,
                results=results,
                adopt=collector.adopt,
                limiter=RateLimiter(),
                log=log,
            )
            self.router.bind(ctx.services.get(AUTHENTICATOR))
            task_status.started()
            await ctx.wait_stopping()
            tg.cancel_scope.cancel()
