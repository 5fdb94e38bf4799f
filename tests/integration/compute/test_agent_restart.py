"""An agent killed with SIGKILL while instances run: the next one takes them over, runs nothing twice,
leaves nothing orphaned, and starts again what died meanwhile.

The platform runs as a child process (``nvcf-mono run``, all-in-one) against a NATS server of the test.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import anyio
import anyio.to_thread
import pytest

from nvcf_mono.bus.nats import open_nats_bus
from nvcf_mono.config.model import BusSettings
from nvcf_mono.metrics import Metrics
from nvcf_mono.ports import spare_port
from nvcf_mono.testing.nats_server import NatsServer
from nvcf_mono.testing.platform import FAST as CONTROL_FAST
from nvcf_mono.testing.platform import Api, wait_for, wait_status
from tests.e2e.cli import Platform, cli_env

from .conftest import (
    CLUSTER_A,
    CLUSTER_B,
    FAST,
    alive,
    all_gone,
    cluster,
    cluster_pids,
    compute_platform,
    create,
    deploy,
    function,
    instances,
    pids,
    running,
    spec,
)

#: A cluster not heard from for 2 s is lost with its instances (the defaults are minutes).
SOON_LOST = {"plugins.control.reconcile.lost_after": "2", "plugins.control.cluster_heartbeat_ttl": "2"}


def _child(nats: NatsServer, state: Path, grpc_port: int, *clusters: dict, **extra: str) -> Platform:
    sets = {
        **CONTROL_FAST,
        **FAST,
        "bus.url": nats.url,
        "http.port": "0",
        # Instances' workers dial this address: it stays the same across restarts.
        "grpc.port": str(grpc_port),
        "shutdown.drain_grace": "3",
        "plugins.compute.clusters": json.dumps(list(clusters) or [cluster("local", CLUSTER_A)]),
        **extra,
    }
    args = ["run", "--state-dir", str(state)]
    for key, value in sets.items():
        args += ["--set", f"{key}={value}"]
    return Platform(args, state, env=cli_env())


@pytest.mark.slow
async def test_a_killed_agent_takes_its_instances_over(tmp_path: Path) -> None:
    nats = NatsServer().start()
    state = tmp_path / "state"
    grpc_port = spare_port()
    first = _child(nats, state, grpc_port)
    second: Platform | None = None
    stray: subprocess.Popen[bytes] | None = None
    foreign: subprocess.Popen[bytes] | None = None
    try:
        doc = await anyio.to_thread.run_sync(first.wait_ready)
        async with (
            aiohttp.ClientSession() as session,
            open_nats_bus(
                BusSettings(connect_retry_for=5.0, request_timeout=5.0, reconnect_wait=0.1),
                servers=[nats.url],
                name="tests",
                metrics=Metrics(),
                log=logging.getLogger("tests.bus"),
            ) as bus,
        ):
            admin = Api(session, doc["api_url"], doc["credentials"]["admin_token"])
            created = await admin.post("/v2/nvcf/functions", function())
            fid, vid = created.json["function"]["id"], created.json["function"]["versionId"]
            d = f"/v2/nvcf/deployments/functions/{fid}/versions/{vid}"
            assert (await admin.post(d, {"deploymentSpecifications": [spec(min_instances=2)]})).status == 200

            async def two_running() -> list | None:
                held = await instances(bus, CLUSTER_A)
                return held if len(held) == 2 and all(v.instance.state == "running" for v in held) else None

            before = await wait_for(two_running, timeout=60, what="two running instances")

            async def active() -> bool:
                return bool((await admin.get(d)).json["deployment"]["functionStatus"] == "ACTIVE")

            await wait_for(active, what="ACTIVE")
            key = Api(session, doc["api_url"], doc["credentials"]["api_key"])
            assert (await key.post(f"/v2/nvcf/pexec/functions/{fid}", {"message": "a"})).status == 200
            recorded = {v.instance.instance_id: {p.role: p.pid for p in v.instance.processes} for v in before}
            assert sorted(cluster_pids(CLUSTER_A)) == sorted(p for procs in recorded.values() for p in procs.values())

            first.signal(signal.SIGKILL)
            await anyio.to_thread.run_sync(first.wait)
            assert all(alive(pid) for procs in recorded.values() for pid in procs.values())
            # While no agent watches: one inference server dies, and a process no record holds appears.
            victim, survivor = sorted(recorded)
            os.kill(recorded[victim]["inference"], signal.SIGKILL)
            # As if the agent died right after starting it; and one of another installation (same cluster id).
            stray = _stray(state / "plugins" / "compute" / CLUSTER_A / "instances")
            foreign = _stray(tmp_path / "elsewhere" / "instances")

            second = _child(nats, state, grpc_port)
            doc = await anyio.to_thread.run_sync(second.wait_ready)
            admin = Api(session, doc["api_url"], doc["credentials"]["admin_token"])
            key = Api(session, doc["api_url"], doc["credentials"]["api_key"])

            async def taken_over() -> list | None:
                held = await two_running()
                if held is None:
                    return None
                restarted = next(v for v in held if v.instance.instance_id == victim)
                return held if restarted.instance.restarts == 1 else None

            after = await wait_for(taken_over, timeout=60, what="both instances running under the new agent")
            now = {v.instance.instance_id: {p.role: p.pid for p in v.instance.processes} for v in after}
            assert set(now) == set(recorded)
            assert now[survivor] == recorded[survivor]  # taken over as it was
            assert now[victim]["worker"] == recorded[victim]["worker"]
            assert now[victim]["inference"] != recorded[victim]["inference"]  # started again, once
            await wait_for(lambda: _ended(stray), what="the stray process to be stopped")
            assert foreign.poll() is None  # not this agent's to stop
            others = {foreign.pid}
            mine = sorted(p for procs in now.values() for p in procs.values())
            assert sorted(set(cluster_pids(CLUSTER_A)) - others) == mine

            async def served() -> bool:
                reply = await key.post(f"/v2/nvcf/pexec/functions/{fid}", {"message": "b"})
                return reply.status == 200 and reply.json["message"] == "b"

            await wait_for(served, timeout=30, what="an invocation served by the adopted instances")
            # The control plane learns of the restarted server from the agent's next report: it may still
            # say DEGRADING for a moment after the agent's own view shows both running.
            await wait_for(active, what="ACTIVE again")
            dep = (await admin.get(d)).json["deployment"]
            assert dep["deploymentSpecifications"][0]["placement"]["runningInstances"] == 2

            second.signal(signal.SIGTERM)
            assert await anyio.to_thread.run_sync(second.wait) == 0
            assert set(cluster_pids(CLUSTER_A)) == others
    finally:
        for child in (first, second):
            if child is not None:
                child.stop()
        for proc in (stray, foreign):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
        for pid in cluster_pids(CLUSTER_A):
            os.killpg(pid, signal.SIGKILL)
        nats.close()


async def _active(admin: Api) -> tuple[str, str, str]:
    """A function deployed with one instance, once ACTIVE: its id, version id and deployment path."""
    fid, vid, d = await create(admin, function())
    await deploy(admin, d, spec())
    await wait_status(admin, d, "ACTIVE")
    return fid, vid, d


def _stray(instances_dir: Path) -> subprocess.Popen[bytes]:
    """A process of this cluster's instance under ``instances_dir`` that no record holds."""
    return subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)"],
        env={
            **cli_env(),
            "NVCF_CLUSTER_ID": CLUSTER_A,
            "INSTANCE_ID": "0-sr-stray",
            "SECRETS_FILE": str(instances_dir / "0-sr-stray" / "secrets.json"),
        },
        start_new_session=True,
    )


async def _ended(proc: subprocess.Popen[bytes] | None) -> bool:
    return proc is not None and proc.poll() is not None


@pytest.mark.slow
async def test_instances_left_running_at_shutdown_are_taken_over_at_the_next_start(tmp_path: Path) -> None:
    # The same gRPC port for both hosts: the instances' workers dial it again once the first host is gone.
    grpc = {"grpc.port": str(spare_port())}
    keep = {"plugins.compute.local.stop_instances_on_shutdown": "false", **grpc}
    async with compute_platform(tmp_path, **keep) as p:
        fid, _, d = await _active(p.admin)
        (before,) = await running(p.bus, CLUSTER_A)
    left = pids([before])
    assert left and all(alive(pid) for pid in left)  # the host stopped; its instances did not
    # The next start (same state, same NATS store) takes them over; this one stops them when it ends.
    async with compute_platform(tmp_path, **grpc) as p:
        (after,) = await running(p.bus, CLUSTER_A)
        assert after.instance.instance_id == before.instance.instance_id and pids([after]) == left
        assert sorted(cluster_pids(CLUSTER_A)) == sorted(left)
        await wait_status(p.admin, d, "ACTIVE")
        # The worker noticed its host go (its session ended) and connected to this one.
        patient = Api(p.key.session, p.key.base, p.key.token, timeout=60, checker=p.key.checker)
        reply = await patient.post(f"/v2/nvcf/pexec/functions/{fid}", {"message": "still here"})
        assert reply.status == 200, reply.body
    await all_gone(left)


@pytest.mark.slow
async def test_instances_stopped_with_the_platform_are_not_failures_of_the_function(tmp_path: Path) -> None:
    # Ctrl-C on `nvcf-mono up` stops the instances (instance-terminated-service-maintenance): the
    # function did nothing wrong, so the next start neither counts nor lists them as failures, and
    # replaces them without a failure's backoff.
    async with compute_platform(tmp_path) as p:
        fid, vid, d = await _active(p.admin)
        (before,) = await running(p.bus, CLUSTER_A)
    await all_gone(pids([before]))
    async with compute_platform(tmp_path) as p:
        (after,) = await running(p.bus, CLUSTER_A)
        assert after.instance.instance_id != before.instance.instance_id
        await wait_status(p.admin, d, "ACTIVE")
        deployment = (await p.admin.get(d)).json["deployment"]
        (placed,) = [s["placement"] for s in deployment["deploymentSpecifications"]]
        assert placed["failedInstances"] == 0 and placed.get("lastFailure") is None, placed
        assert not deployment.get("healthInfo"), deployment["healthInfo"]
        listed = (await p.admin.get(f"/v2/nvcf/functions/{fid}/versions/{vid}/instances")).json["instances"]
        assert [i["instanceStatus"] for i in listed] == ["ACTIVE"], listed


@pytest.mark.slow
async def test_a_cluster_stopped_with_its_instances_gets_no_new_ones_until_it_is_back(tmp_path: Path) -> None:
    # Cluster A's agent stops (its instance with it) and the next start runs only B. The agent says
    # so before it goes: the instance's end is recorded as it stops, and A is cordoned, so the
    # replacement goes to B at once (lost_after, far away here, plays no part).
    lost = {"plugins.control.reconcile.lost_after": "600", "plugins.control.cluster_heartbeat_ttl": "60"}
    async with compute_platform(tmp_path, [cluster("a", CLUSTER_A)], **lost) as p:
        fid, vid, d = await _active(p.admin)
        (before,) = await running(p.bus, CLUSTER_A)
    await all_gone(pids([before]))
    async with compute_platform(tmp_path, [cluster("b", CLUSTER_B)], **lost) as p:
        (after,) = await running(p.bus, CLUSTER_B, timeout=60)
        patient = Api(p.key.session, p.key.base, p.key.token, timeout=60, checker=p.key.checker)
        reply = await patient.post(f"/v2/nvcf/pexec/functions/{fid}", {"message": "placed again"})
        assert reply.status == 200, reply.body
        listed = (await p.admin.get(f"/v2/nvcf/functions/{fid}/versions/{vid}/instances")).json["instances"]
        assert [(i["instanceId"], i["clusterId"]) for i in listed] == [(after.instance.instance_id, CLUSTER_B)]
        deployment = (await p.admin.get(d)).json["deployment"]
        (placed,) = [s["placement"] for s in deployment["deploymentSpecifications"]]
        assert placed["failedInstances"] == 0, placed


@pytest.mark.slow
async def test_instances_of_a_cluster_lost_with_its_machine_are_placed_again_elsewhere(tmp_path: Path) -> None:
    # The platform with cluster A is killed with SIGKILL and A's instances die too (the machine is
    # gone): nobody reports their end. After lost_after without a heartbeat from A the control plane
    # forgets them and places the instance on B. Without that it stays "running" on A for good and
    # the function's requests wait forever.
    nats = NatsServer().start()
    state, grpc_port = tmp_path / "state", spare_port()
    lost = SOON_LOST
    first = _child(nats, state, grpc_port, cluster("a", CLUSTER_A), **lost)
    second: Platform | None = None
    try:
        doc = await anyio.to_thread.run_sync(first.wait_ready)
        async with aiohttp.ClientSession() as session:
            admin = Api(session, doc["api_url"], doc["credentials"]["admin_token"])
            fid, _, d = await _active(admin)
            first.signal(signal.SIGKILL)
            await anyio.to_thread.run_sync(first.wait)
            for pid in cluster_pids(CLUSTER_A):
                os.killpg(pid, signal.SIGKILL)

            second = _child(nats, state, grpc_port, cluster("b", CLUSTER_B), **lost)
            doc = await anyio.to_thread.run_sync(second.wait_ready)
            admin = Api(session, doc["api_url"], doc["credentials"]["admin_token"])
            key = Api(session, doc["api_url"], doc["credentials"]["api_key"], timeout=60)
            reply = await key.post(f"/v2/nvcf/pexec/functions/{fid}", {"message": "placed again"})
            assert reply.status == 200, reply.body
            await wait_status(admin, d, "ACTIVE")  # the agent reports the instance running after it served
            (placed,) = [s["placement"] for s in (await admin.get(d)).json["deployment"]["deploymentSpecifications"]]
            assert placed["runningInstances"] == 1 and placed["failedInstances"] == 0, placed
            assert cluster_pids(CLUSTER_B)
    finally:
        for child in (first, second):
            if child is not None:
                child.stop()
        for pid in cluster_pids(CLUSTER_A) + cluster_pids(CLUSTER_B):
            os.killpg(pid, signal.SIGKILL)
        nats.close()


@pytest.mark.slow
async def test_an_instance_whose_worker_still_serves_is_not_lost_with_its_agent(tmp_path: Path) -> None:
    # A's agent is gone but its instance was left running and its worker serves the next host: it is
    # the deployment's instance still, however long A stays silent.
    grpc = {"grpc.port": str(spare_port())}
    # lost_after leaves the worker time to find the next host: its reconnection backs off (0.2 s, doubling).
    lost = {"plugins.control.reconcile.lost_after": "12", "plugins.control.cluster_heartbeat_ttl": "2", **grpc}
    keep = {"plugins.compute.local.stop_instances_on_shutdown": "false"}
    async with compute_platform(tmp_path, [cluster("a", CLUSTER_A)], **lost, **keep) as p:
        fid, vid, _ = await _active(p.admin)
        (before,) = await running(p.bus, CLUSTER_A)
    left = pids([before])
    try:
        async with compute_platform(tmp_path, [cluster("b", CLUSTER_B)], **lost) as p:
            patient = Api(p.key.session, p.key.base, p.key.token, timeout=60, checker=p.key.checker)
            reply = await patient.post(f"/v2/nvcf/pexec/functions/{fid}", {"message": "still here"})
            assert reply.status == 200, reply.body
            await anyio.sleep(12)  # past lost_after since A was last heard from; reconcile rounds every 0.5 s
            listed = (await p.admin.get(f"/v2/nvcf/functions/{fid}/versions/{vid}/instances")).json["instances"]
            assert [i["instanceId"] for i in listed] == [before.instance.instance_id], listed
            assert await instances(p.bus, CLUSTER_B) == []
    finally:
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
async def test_a_nats_outage_longer_than_lost_after_loses_no_instance(tmp_path: Path) -> None:
    # While NATS is down nobody hears any cluster, and nothing may be lost for it. Several things see to
    # that (the leader loses its lease during the outage, a new term and a cut-off bus start the count
    # of silence again): whichever acts, the instance that served before the outage serves after it.
    nats = NatsServer().start()
    lost = SOON_LOST
    child = _child(nats, tmp_path / "state", spare_port(), cluster("a", CLUSTER_A), **lost)
    try:
        doc = await anyio.to_thread.run_sync(child.wait_ready)
        async with aiohttp.ClientSession() as session:
            admin = Api(session, doc["api_url"], doc["credentials"]["admin_token"])
            fid, vid, _ = await _active(admin)
            (before,) = (await admin.get(f"/v2/nvcf/functions/{fid}/versions/{vid}/instances")).json["instances"]
            nats.stop()
            await anyio.sleep(6)  # lost_after three times over
            await anyio.to_thread.run_sync(nats.start)
            key = Api(session, doc["api_url"], doc["credentials"]["api_key"], timeout=60)
            reply = await key.post(f"/v2/nvcf/pexec/functions/{fid}", {"message": "after the outage"})
            assert reply.status == 200, reply.body
            await anyio.sleep(4)  # past lost_after again, with the bus back
            listed = (await admin.get(f"/v2/nvcf/functions/{fid}/versions/{vid}/instances")).json["instances"]
            assert [i["instanceId"] for i in listed] == [before["instanceId"]], listed
    finally:
        child.stop()
        for pid in cluster_pids(CLUSTER_A):
            os.killpg(pid, signal.SIGKILL)
        nats.close()
