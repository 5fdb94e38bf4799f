"""The control plane's plugin: the NVCF management API, accounts and keys, clusters, deployments.

Every control-plane process serves the API and the agents' calls (a NATS queue group); one of them
at a time, the holder of the reconciler lease, places and terminates instances.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import ClassVar

import anyio
from anyio.abc import TaskStatus

from nvcf_mono import console
from nvcf_mono.auth.delegation import DELEGATION_TOKENS
from nvcf_mono.auth.keystore import API_KEY_STORE
from nvcf_mono.auth.secret import KEYRING
from nvcf_mono.auth.strategy import AUTHENTICATOR
from nvcf_mono.autoscaling import AUTOSCALING_POLICIES
from nvcf_mono.bus.codec import TypedKV
from nvcf_mono.contracts import buckets, streams
from nvcf_mono.helm import CHART_RENDERER
from nvcf_mono.http.api import ApiRouter, Gatekeeper
from nvcf_mono.miniservice_extensions import MINISERVICE_EXTENSIONS, chart_types
from nvcf_mono.planes.control.api import ALL as API_MODULES
from nvcf_mono.planes.control.autoscale.autoscaler import Autoscaler
from nvcf_mono.planes.control.autoscale.observations import LoadBook
from nvcf_mono.planes.control.bootstrap import bootstrap_keys, ensure_account
from nvcf_mono.planes.control.config import ControlConfig
from nvcf_mono.planes.control.context import Control, ControlParts
from nvcf_mono.planes.control.example import ExampleFunction
from nvcf_mono.planes.control.icms import Icms
from nvcf_mono.planes.control.leader import LeaderLease
from nvcf_mono.planes.control.reconcile.reconciler import Reconciler
from nvcf_mono.planes.control.store import ControlStore
from nvcf_mono.planes.control.tasks.scheduler import TaskScheduler
from nvcf_mono.planes.control.tasks.worker_calls import TaskWorkerCalls
from nvcf_mono.plugin import BasePlugin, PluginSpec, RunContext, SetupContext

BUCKETS = (
    buckets.ACCOUNTS,
    buckets.FUNCTIONS,
    buckets.DEPLOYMENTS,
    buckets.PLACEMENTS,
    buckets.AUTOSCALER,
    buckets.CLUSTERS,
    buckets.CLUSTER_HEALTH,
    buckets.SECRETS,
    buckets.REGISTRY_CREDENTIALS,
    buckets.TELEMETRIES,
    buckets.AUTHORIZATIONS,
    buckets.ASSETS,
    buckets.LEASES,
    buckets.TASKS,
    buckets.TASK_EVENTS,
    buckets.TASK_RESULTS,
)
RECONCILER_LEASE = "control-reconciler"


class ControlPlane(BasePlugin[ControlConfig]):
    """Plugin ``control``."""

    spec: ClassVar[PluginSpec] = PluginSpec(
        name="control",
        description="Control plane: the NVCF management API, accounts, keys, clusters and deployments.",
        roles=frozenset({"all-in-one", "control"}),
        requires=("auth",),
        after=("auth_api_key", "auth_static_token", "auth_jwt", "auth_delegation", "helm"),
        config_type=ControlConfig,
    )

    def setup(self, ctx: SetupContext) -> None:
        for bucket in BUCKETS:
            ctx.declare_bucket(bucket)
        ctx.declare_object_store(buckets.ASSET_CONTENT)
        ctx.declare_object_store(buckets.TASK_RESULT_CONTENT)
        ctx.declare_stream(streams.CREATE_STREAM)
        ctx.declare_stream(streams.TERMINATE_STREAM)
        self.ctl = Control(config=self.config, settings=ctx.settings, log=ctx.log)
        self.router = ApiRouter()
        for module in API_MODULES:
            module.routes.bind(self.router, self.ctl)
        self.router.install(ctx)
        if self.config.console:
            for method, path, handler in console.routes():
                ctx.add_route(method, path, handler)

    async def run(self, ctx: RunContext[ControlConfig], *, task_status: TaskStatus[None]) -> None:
        ctl = self.ctl
        store = ControlStore(ctx.bus, ctx.log, signal=ctl.wake)
        keys = ctx.services.find(API_KEY_STORE)
        async with anyio.create_task_group() as tg:
            await tg.start(store.run, ctx.bus)
            ctl.parts.set(
                ControlParts(
                    store=store,
                    bus=ctx.bus,
                    keyring=ctx.services.get(KEYRING),
                    keys=keys,
                    endpoints=ctx.endpoints,
                    charts=ctx.services.find(CHART_RENDERER),
                    delegation=ctx.services.find(DELEGATION_TOKENS),
                    chart_types=chart_types(ext.value for ext in ctx.services.extensions(MINISERVICE_EXTENSIONS)),
                )
            )

            async def account_exists(nca_id: str) -> bool:
                return await store.accounts.fetch(nca_id) is not None

            self.router.gatekeeper.set(Gatekeeper(ctx.services.get(AUTHENTICATOR), account_exists=account_exists))
            await ensure_account(ctl, self.config.default_account, clients=("ncp",))
            bootstrap = self.config.bootstrap_keys
            if keys is not None and (ctx.settings.role == "all-in-one" if bootstrap is None else bootstrap):
                for name, value in (await bootstrap_keys(ctl, keys, ctx.state_dir)).items():
                    ctx.set_credential(name, value)
            example = self.config.example_function
            if ctx.settings.role == "all-in-one" if example is None else example:
                # Prepared before ready, so the ready banner can already name the example.
                examples = ExampleFunction(ctl, ctx.state_dir, ctx.log.getChild("example"))
                examples.prepare()
                tg.start_soon(examples.run)
            icms = Icms(ctl, ctx.log)
            await tg.start(icms.serve)
            await tg.start(icms.serve_secrets)
            lease = LeaderLease(
                TypedKV(ctx.bus.kv(buckets.LEASES.name), buckets.LEASE),
                RECONCILER_LEASE,
                node=ctx.settings.node.id or "control",
                ttl=self.config.reconcile.lease_ttl,
                log=ctx.log,
            )
            scaling = self.config.autoscaler
            book = LoadBook(keep=scaling.lookback + scaling.utilization_window + scaling.sample_step)
            policies = [ext.value for ext in ctx.services.extensions(AUTOSCALING_POLICIES)]
            autoscaler = Autoscaler(ctl, book, ctx.metrics, ctx.log.getChild("autoscaler"), policies)
            await tg.start(autoscaler.listen)
            reconciler = Reconciler(
                ctl,
                ctx.metrics,
                ctx.log,
                busy=lambda fvid: book.busy(fvid, scaling.worker_stale),
                serving=lambda fvid: book.serving(fvid, scaling.worker_stale),
            )

            tasks = TaskScheduler(ctl, ctx.metrics, ctx.log.getChild("tasks"))
            await tg.start(TaskWorkerCalls(ctl, ctx.log.getChild("tasks")).serve)

            async def lead() -> None:
                async with anyio.create_task_group() as leading:
                    leading.start_soon(reconciler.lead)
                    leading.start_soon(autoscaler.lead)
                    leading.start_soon(tasks.lead)

            leader_gauge = ctx.metrics.gauge(
                "nvcf_control_leader",
                "1 while this process leads (reconciler, autoscaler, task scheduler).",
            )
            leader_gauge.set_function(lambda: [((), 1.0 if lease.is_leader else 0.0)])
            await _lead_until_stopping(ctx, lease, lead, task_status)
            # The agents' calls are served until this plugin is stopped, after the compute plugin
            # (plugins stop in reverse order): an agent of this process reports the instances it stops
            # while the host drains.
            await anyio.sleep_forever()


async def _lead_until_stopping(
    ctx: RunContext[ControlConfig],
    lease: LeaderLease,
    lead: Callable[[], Awaitable[None]],
    task_status: TaskStatus[None],
) -> None:
    """Contend for the lease, leading while held, until the host begins to drain: then give it up, so
    another control process takes over at once.
    """
    async with anyio.create_task_group() as leadership:
        await leadership.start(lease.run, lead)
        task_status.started()
        await ctx.wait_stopping()
        await lease.release()
        leadership.cancel_scope.cancel()
