"""Compute backends are plugins: a cluster runs on the backend its ``backend:`` names."""

from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar, final

import pytest
from anyio.abc import TaskStatus

from nvcf_mono.planes.compute.backends import COMPUTE_BACKENDS, BackendContext, LaunchSpec
from nvcf_mono.planes.compute.backends.local import LocalBackend, LocalInstance
from nvcf_mono.plugin import BasePlugin, PluginSpec, RunContext, SetupContext
from nvcf_mono.testing.host import running_host
from nvcf_mono.testing.platform import platform_config, wait_status

from .conftest import CLUSTER_A, FAST, cluster, compute_platform, create, deploy, running, spec

STARTED: list[str] = []


@final
class CountingBackend(LocalBackend):
    """The local backend, counting the instances it starts (what a plugin's own backend would do)."""

    name = "counting"

    async def start(self, launch: LaunchSpec) -> LocalInstance:
        STARTED.append(launch.instance_id)
        return await super().start(launch)


@final
class CountingProvider:
    name = "counting"

    def create(self, ctx: BackendContext) -> CountingBackend:
        c = ctx.config
        return CountingBackend(catalog=ctx.catalog, environ=ctx.environ, health=c.health, local=c.local, log=ctx.log)


class CountingPlugin(BasePlugin[None]):
    """A plugin that only contributes a compute backend."""

    spec: ClassVar[PluginSpec] = PluginSpec(
        name="counting_backend", description="Test: a compute backend.", roles=frozenset({"all-in-one"})
    )

    def setup(self, ctx: SetupContext) -> None:
        ctx.extend(COMPUTE_BACKENDS, CountingProvider())

    async def run(self, ctx: RunContext[None], *, task_status: TaskStatus[None]) -> None:
        task_status.started()
        await ctx.wait_stopping()


PLUGIN = f"{__name__}:CountingPlugin"


@pytest.mark.slow
async def test_a_cluster_runs_on_the_backend_a_plugin_contributes(tmp_path: Path) -> None:
    STARTED.clear()
    clusters = [cluster("local", CLUSTER_A, backend="counting")]
    async with compute_platform(tmp_path, clusters, extra_plugins=json.dumps([PLUGIN])) as p:
        fid, _, d = await create(p.admin, {"name": "echo", **_ECHO})
        await deploy(p.admin, d, spec())
        await wait_status(p.admin, d, "ACTIVE")
        (view,) = await running(p.bus, CLUSTER_A)
        assert [view.instance.instance_id] == STARTED
        reply = await p.key.post(f"/v2/nvcf/pexec/functions/{fid}", {"message": "via a plugin's backend"})
        assert reply.status == 200, reply.body


async def test_a_cluster_naming_an_unknown_backend_stops_the_host_with_a_clear_error(tmp_path: Path) -> None:
    settings = {**FAST, "plugins.compute.clusters": json.dumps([cluster("local", CLUSTER_A, backend="pods")])}
    config = platform_config(tmp_path / "state", settings=settings)
    with pytest.raises(BaseException) as caught:
        async with running_host(config):
            pass
    assert "no compute backend named 'pods' (available: containers, kubernetes, local" in _messages(caught.value)


async def test_a_containers_cluster_without_an_engine_stops_the_host_with_a_clear_error(tmp_path: Path) -> None:
    missing = tmp_path / "no-engine.sock"
    chosen = [cluster("local", CLUSTER_A, backend="containers", containers={"socket": str(missing)})]
    config = platform_config(tmp_path / "state", settings={**FAST, "plugins.compute.clusters": json.dumps(chosen)})
    with pytest.raises(BaseException) as caught:
        async with running_host(config):
            pass
    said = _messages(caught.value)
    assert f"cluster {CLUSTER_A} (backend: containers): no container engine answers (unix://{missing}" in said, said
    assert "plugins.compute.clusters[].containers.socket" in said


async def test_a_kubernetes_cluster_without_a_cluster_to_reach_stops_the_host_with_a_clear_error(
    tmp_path: Path,
) -> None:
    missing = tmp_path / "no-such-kubeconfig"
    gpu_a = {**cluster("gpu-a", CLUSTER_A, backend="kubernetes"), "kubernetes": {"kubeconfig": str(missing)}}
    settings = {**FAST, "plugins.compute.clusters": json.dumps([gpu_a])}
    config = platform_config(tmp_path / "state", settings=settings)
    with pytest.raises(BaseException) as caught:
        async with running_host(config):
            pass
    assert f"cluster gpu-a: cannot configure a Kubernetes client from kubeconfig {missing}" in _messages(caught.value)


def _messages(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return " | ".join(_messages(e) for e in exc.exceptions)
    return f"{exc} {_messages(exc.__cause__) if exc.__cause__ else ''}"


_ECHO = {
    "inferenceUrl": "/echo",
    "inferencePort": 9000,
    "containerImage": "echo",
    "health": {"protocol": "HTTP", "uri": "/health", "port": 9000, "timeout": "PT5S", "expectedStatusCode": 200},
}
