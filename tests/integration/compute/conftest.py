"""Compute-plane tests: the real cluster agent in the all-in-one platform, instances as real processes.

Clusters are configured per test with a static (fake) GPU inventory, so a machine with real GPUs
gives the same results; timers are short so failures, restarts and replacements show in seconds.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from nvcf_mono.bus.api import Bus
from nvcf_mono.contracts import rpc, subjects
from nvcf_mono.contracts.agent import AgentInstances, AgentInstanceView, AgentQuery
from nvcf_mono.testing.platform import Api, wait_for
from nvcf_mono.testing.running import ECHO_FUNCTION, Platform, platform
from tests.support.procs import alive, live_processes

__all__ = ["ECHO_FUNCTION", "Platform", "alive", "platform"]

#: Timers short enough to see restarts, failures and replacements within a test.
FAST: dict[str, str] = {
    "plugins.compute.heartbeat_interval": "0.5",
    "plugins.compute.status_interval": "5",
    "plugins.compute.sync_interval": "1",
    "plugins.compute.sync_grace": "3",
    "plugins.compute.capacity_backoff": "0.5",
    "plugins.compute.fetch_timeout": "0.5",
    "plugins.compute.retry_backoff_max": "0.5",
    "plugins.compute.health.probe_interval": "0.2",
    "plugins.compute.health.restart_backoff": "0.1",
    "plugins.compute.health.restart_backoff_max": "0.5",
    "plugins.compute.local.termination_grace": "3",
}

# Unique per test session: processes are told apart by their cluster, and other sessions may run beside this one.
CLUSTER_A = str(uuid.uuid4())
CLUSTER_B = str(uuid.uuid4())


def cluster(name: str, cluster_id: str, gpu: str = "H100", count: int = 8, nodes: int = 1, **extra: Any) -> dict:
    """One cluster setting with a static inventory (never the machine's real GPUs)."""
    return {
        "name": name,
        "id": cluster_id,
        "gpu_discovery": "static",
        "gpus": [{"name": gpu, "count": count, "nodes": nodes}],
        **extra,
    }


@asynccontextmanager
async def compute_platform(
    tmp_path: Path, clusters: Sequence[dict] | None = None, **settings: Any
) -> AsyncIterator[Platform]:
    """The all-in-one platform with the compute plugin's agents (default: one 'local' cluster, 8 H100)."""
    chosen = list(clusters) if clusters is not None else [cluster("local", CLUSTER_A)]
    values = {**FAST, "plugins.compute.clusters": json.dumps(chosen), **settings}
    async with platform(tmp_path, **values) as p:
        # The host is ready before its agents have registered their clusters; a task launched in
        # between is refused (no backend yet), so tests start once every cluster is known.
        for entry in chosen:

            async def registered(cluster_id: str = entry["id"]) -> bool:
                return (await p.admin.get(f"/v1/accounts/nvcf-default/clusters/{cluster_id}")).status == 200

            await wait_for(registered, timeout=30, what=f"cluster {entry['name']} to register")
        yield p


def function(name: str = "echo", **changes: Any) -> dict:
    return {**ECHO_FUNCTION, "name": name, **changes}


def spec(
    gpu: str = "H100", size: int = 1, min_instances: int = 1, max_instances: int | None = None, **extra: Any
) -> dict:
    return {
        "gpu": gpu,
        "instanceType": f"ON-PREM.GPU.{gpu}_{size}x",
        "minInstances": min_instances,
        "maxInstances": max_instances if max_instances is not None else max(min_instances, 1),
        **extra,
    }


async def create(api: Api, body: dict) -> tuple[str, str, str]:
    """Create a function; (fid, vid, deployment path)."""
    reply = await api.post("/v2/nvcf/functions", body)
    assert reply.status == 200, reply.body
    fn = reply.json["function"]
    return fn["id"], fn["versionId"], f"/v2/nvcf/deployments/functions/{fn['id']}/versions/{fn['versionId']}"


async def deploy(api: Api, d: str, *specs: dict) -> dict:
    reply = await api.post(d, {"deploymentSpecifications": list(specs)})
    assert reply.status == 200, reply.body
    return reply.json["deployment"]


async def instances(bus: Bus, cluster_id: str, *, finished: bool = False) -> list[AgentInstanceView]:
    """What a cluster's agent holds (its query subject)."""
    reply = await rpc.call(
        bus, subjects.agent_subject("instances", cluster_id), AgentQuery(finished=finished), AgentInstances
    )
    return list(reply.instances)


async def running(bus: Bus, cluster_id: str, count: int = 1, timeout: float = 30.0) -> list[AgentInstanceView]:
    """Wait until ``count`` instances of the cluster report running; returns them."""

    async def probe() -> list[AgentInstanceView] | None:
        held = [v for v in await instances(bus, cluster_id) if v.instance.state == "running"]
        return held if len(held) >= count else None

    return await wait_for(probe, timeout=timeout, what=f"{count} running instance(s)")


def pids(views: Sequence[AgentInstanceView]) -> list[int]:
    return [p.pid for v in views for p in v.instance.processes]


def cluster_pids(cluster_id: str) -> list[int]:
    """Every live process started for an instance of this cluster (their environment names it)."""
    entry = f"NVCF_CLUSTER_ID={cluster_id}".encode()
    return [proc.pid for proc in live_processes() if entry in proc.environ()]


async def all_gone(found: Sequence[int], timeout: float = 15.0) -> None:
    async def probe() -> bool:
        return not any(alive(pid) for pid in found)

    await wait_for(probe, timeout=timeout, what=f"processes {list(found)} to end")


def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.decode().split("=", 1) for item in raw.split(b"\0") if b"=" in item)


__all__ += ["os"]
