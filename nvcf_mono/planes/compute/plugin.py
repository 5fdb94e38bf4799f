"""The compute plane's plugin: one cluster agent (NVCA) per configured cluster, each on its backend.

The default configuration runs one cluster, ``local``, whose instances are processes on this machine
(its GPUs from ``nvidia-smi``, or a fake inventory of 8 H100). The top-level ``images:`` section is
the local backend's image catalog: which command line a function's ``containerImage`` runs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from contextlib import AsyncExitStack
from functools import partial
from typing import ClassVar

import anyio
from anyio.abc import TaskStatus

from nvcf_mono import __version__
from nvcf_mono.bus.errors import BusError
from nvcf_mono.contracts import buckets, streams
from nvcf_mono.helm import CHART_RENDERER
from nvcf_mono.miniservice_extensions import MINISERVICE_EXTENSIONS
from nvcf_mono.planes.compute.agent import ClusterAgent
from nvcf_mono.planes.compute.backends import COMPUTE_BACKENDS, Backend, BackendContext, WorkerEndpoint
from nvcf_mono.planes.compute.backends.containers import ContainersProvider
from nvcf_mono.planes.compute.backends.kubernetes import KubernetesProvider
from nvcf_mono.planes.compute.backends.local import LocalProvider
from nvcf_mono.planes.compute.config import ComputeConfig, Image, image_catalog, stops_instances_on_shutdown
from nvcf_mono.planes.compute.identity import cluster_ids, identity
from nvcf_mono.plugin import BasePlugin, PluginConfigError, PluginNotReady, PluginSpec, RunContext, SetupContext


class ComputePlane(BasePlugin[ComputeConfig]):
    """Plugin ``compute``."""

    spec: ClassVar[PluginSpec] = PluginSpec(
        name="compute",
        description="Compute plane: the cluster agent that runs function instances on its backend.",
        roles=frozenset({"all-in-one", "compute"}),
        # Started after the planes it reports to, so it stops before them.
        after=("control", "invocation", "helm"),
        config_type=ComputeConfig,
        sections={"images": Mapping[str, Image]},
    )

    def setup(self, ctx: SetupContext) -> None:
        ctx.declare_bucket(buckets.AGENT_REQUESTS)
        ctx.declare_stream(streams.CREATE_STREAM)
        ctx.declare_stream(streams.TERMINATE_STREAM)
        self.catalog = image_catalog(ctx.section("images"))
        ctx.extend(COMPUTE_BACKENDS, LocalProvider())
        ctx.extend(COMPUTE_BACKENDS, KubernetesProvider())
        ctx.extend(COMPUTE_BACKENDS, ContainersProvider())

    async def run(self, ctx: RunContext[ComputeConfig], *, task_status: TaskStatus[None]) -> None:
        config = self.config
        ids = cluster_ids(ctx.state_dir, config.clusters)
        endpoint = WorkerEndpoint()
        backends = self._backends(ctx, ids, endpoint)
        agents = [
            ClusterAgent(
                bus=ctx.bus,
                cluster=cluster,
                ident=identity(cluster, ids[cluster.name], ctx.settings.node.region),
                config=config,
                backend=backends[cluster.backend],
                state_dir=ctx.state_dir / ids[cluster.name],
                log=ctx.log.getChild(cluster.name),
                version=__version__,
                endpoint=endpoint,
            )
            for cluster in config.clusters
        ]
        _metrics(ctx, agents)
        async with AsyncExitStack() as stack:
            # Backends first: a Kubernetes cluster's GPUs are discovered through its backend.
            for backend in backends.values():
                await stack.enter_async_context(backend)
            try:
                for agent in agents:
                    await agent.prepare()
            except BusError as err:
                raise PluginNotReady(f"the bus is not ready for the cluster agents: {err}") from err
            await self._serve(ctx, agents, task_status)

    def _backends(
        self, ctx: RunContext[ComputeConfig], ids: Mapping[str, str], endpoint: WorkerEndpoint
    ) -> dict[str, Backend]:
        """One backend per name the clusters use, from the providers plugins contributed."""
        providers = {ext.value.name: ext.value for ext in ctx.services.extensions(COMPUTE_BACKENDS)}
        wanted = sorted({cluster.backend for cluster in self.config.clusters})
        unknown = [name for name in wanted if name not in providers]
        if unknown:
            raise ComputeConfigError(
                f"plugins.compute.clusters: no compute backend named {', '.join(map(repr, unknown))} "
                f"(available: {', '.join(sorted(providers))}; a plugin that provides one must be enabled)"
            )
        made = BackendContext(
            config=self.config,
            catalog=self.catalog,
            environ=dict(os.environ),  # noqa: TID251 - instance processes inherit the host's environment
            state_dir=ctx.state_dir,
            log=ctx.log,
            cluster_ids=ids,
            charts=ctx.services.find(CHART_RENDERER),
            endpoint=endpoint,
            miniservice_extensions=tuple(ext.value for ext in ctx.services.extensions(MINISERVICE_EXTENSIONS)),
        )
        return {name: providers[name].create(made) for name in wanted}

    async def _serve(
        self, ctx: RunContext[ComputeConfig], agents: list[ClusterAgent], task_status: TaskStatus[None]
    ) -> None:
        config = self.config
        async with anyio.create_task_group() as tg:
            for agent in agents:
                await tg.start(agent.run)
            task_status.started()
            async with ctx.when_stopping():
                grace = min(config.local.termination_grace, ctx.settings.shutdown.drain_grace)
                async with anyio.create_task_group() as stops:
                    for agent in agents:
                        stops.start_soon(
                            partial(
                                agent.shutdown,
                                stop_instances=stops_instances_on_shutdown(agent.cluster, config.local),
                                grace=grace,
                            )
                        )
            tg.cancel_scope.cancel()


class ComputeConfigError(PluginConfigError):
    """A cluster names a backend no plugin provides."""


def _metrics(ctx: RunContext[ComputeConfig], agents: list[ClusterAgent]) -> None:
    """Instances by state and GPUs by use, per cluster, read at every scrape."""
    instances = ctx.metrics.gauge(
        "nvcf_compute_instances", "Instances a cluster agent holds, by instanceState.", ("cluster", "state")
    )
    gpus = ctx.metrics.gauge(
        "nvcf_compute_gpus", "GPUs of a cluster: capacity and allocated.", ("cluster", "gpu", "kind")
    )

    def count_instances() -> list[tuple[tuple[str, ...], float]]:
        counts: dict[tuple[str, ...], float] = {}
        for agent in agents:
            for req in agent.book:
                for inst in req.instances:
                    key = (agent.ident.name, inst.state)
                    counts[key] = counts.get(key, 0) + 1
        return sorted(counts.items())

    def count_gpus() -> list[tuple[tuple[str, ...], float]]:
        out: list[tuple[tuple[str, ...], float]] = []
        for agent in agents:
            for name, usage in sorted(agent.allocator.usage().items()):
                out.append(((agent.ident.name, name, "capacity"), float(usage.capacity)))
                out.append(((agent.ident.name, name, "allocated"), float(usage.allocated)))
        return out

    instances.set_function(count_instances)
    gpus.set_function(count_gpus)
