"""Thousands of versions on the embedded defaults: the store holds what is queued, not what was deployed.

Each version's queue used to reserve 1 GiB of the 10 GiB store and keep it after its deployment
went, so the 11th version could not be invoked. Here every version is created, deployed at min 0,
invoked once (the request waits: nothing serves it), undeployed and deleted; each waiting caller
is answered (404: undeployed before it ran) and the store's reserved and used bytes, streams and
consumers return to where they started.
"""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import pytest

from nvcf_mono.contracts import subjects
from nvcf_mono.models.account import DEFAULT_ACCOUNT
from nvcf_mono.testing.platform import Api, wait_for
from nvcf_mono.testing.running import ECHO_FUNCTION, agent, platform
from nvcf_mono.testing.scripted_agent import gpu_inventory
from tests.chaos.tally import SCALE, Tally, scaled

pytestmark = [pytest.mark.nats, pytest.mark.slow, pytest.mark.chaos, pytest.mark.timeout(120 + 60 * SCALE)]

FAST_RETIRE = {
    "plugins.invocation.sweep_interval": "0.5",
    "plugins.invocation.retired_queue_grace": "1",
    "bus.deleted_key_ttl": "2",
}
#: What the platform's own housekeeping may add meanwhile (cluster heartbeats, rate-limit counters).
SLACK = 16 * 1024


def _phase(name: str, started: float) -> None:
    print(f"chaos[versions] {name}: {time.perf_counter() - started:.1f}s", flush=True)


async def test_versions_cost_what_is_queued_and_leave_nothing_behind(tmp_path: Path) -> None:
    versions = scaled(200)
    tally = Tally("versions")
    async with platform(tmp_path, **FAST_RETIRE) as p, agent(p.bus, gpus=[gpu_inventory("H100", 8, nodes=400)]):
        region = p.host.settings.node.region
        api = Api(p.admin.session, p.admin.base, p.admin.token, timeout=60)
        raised = await api.patch(f"/v2/nvcf/accounts/{DEFAULT_ACCOUNT}", {"maxFunctionsAllowed": versions + 10})
        assert raised.status == 200, raised.body
        baseline = await p.bus.usage()
        t0 = time.perf_counter()
        made: list[tuple[str, str, str, str]] = []  # function, version, request id, token
        deploy_seconds: list[float] = []
        slots = anyio.Semaphore(16)

        async def one(i: int) -> None:
            async with slots:
                created = await api.post("/v2/nvcf/functions", {**ECHO_FUNCTION, "name": f"v{i}"})
                assert created.status == 200, created.body
                fid, vid = created.json["function"]["id"], created.json["function"]["versionId"]
                started = time.perf_counter()
                spec = {"gpu": "H100", "instanceType": "ON-PREM.GPU.H100_1x", "minInstances": 0, "maxInstances": 1}
                deployed = await api.post(
                    f"/v2/nvcf/deployments/functions/{fid}/versions/{vid}", {"deploymentSpecifications": [spec]}
                )
                assert deployed.status == 200, deployed.body
                deploy_seconds.append(time.perf_counter() - started)
                token = f"t{i}"
                tally.sent += 1
                reply = await api.post(
                    f"/v2/nvcf/pexec/functions/{fid}", {"message": token}, headers={"NVCF-POLL-SECONDS": "1"}
                )
                assert reply.status == 202, (reply.status, reply.body)
                tally.accepted.add(token)
                made.append((fid, vid, reply.headers["NVCF-REQID"], token))

        with anyio.fail_after(60 + versions):
            async with anyio.create_task_group() as tg:
                for i in range(versions):
                    tg.start_soon(one, i)
        _phase("created, deployed and invoked", t0)
        loaded = await p.bus.usage()
        queues = await p.bus.stream_names(subjects.request_streams_filter(region))
        assert len(queues) == versions
        # No reservation per version: what is reserved does not grow with the versions deployed.
        assert loaded.reserved_storage == baseline.reserved_storage

        async def undeploy(fid: str, vid: str) -> None:
            async with slots:
                gone = await api.delete(f"/v2/nvcf/deployments/functions/{fid}/versions/{vid}")
                assert gone.status == 200, gone.body

        async with anyio.create_task_group() as tg:
            for fid, vid, _, _ in made:
                tg.start_soon(undeploy, fid, vid)

        _phase("undeployed", t0)

        async def follow(request_id: str, token: str) -> None:
            async with slots:
                while True:
                    reply = await api.get(f"/v2/nvcf/pexec/status/{request_id}", headers={"NVCF-POLL-SECONDS": "5"})
                    if reply.status == 202:
                        continue
                    right = reply.status == 404 and "undeployed before this request ran" in reply.detail
                    tally.answered(token, right=right)
                    if not right:
                        tally.errors[reply.status] += 1
                    return

        with anyio.fail_after(60 + versions // 5):
            async with anyio.create_task_group() as tg:
                for _, _, request_id, token in made:
                    tg.start_soon(follow, request_id, token)

        _phase("answered", t0)

        async def delete(fid: str, vid: str) -> None:
            async with slots:
                gone = await api.delete(f"/v2/nvcf/functions/{fid}/versions/{vid}")
                assert gone.status == 204, gone.body

        async with anyio.create_task_group() as tg:
            for fid, vid, _, _ in made:
                tg.start_soon(delete, fid, vid)

        _phase("deleted", t0)

        async def queues_gone() -> bool:
            return not await p.bus.stream_names(subjects.request_streams_filter(region))

        await wait_for(queues_gone, timeout=60, interval=0.5, what="every request queue to be removed")

        async def settled() -> bool:
            # Deleted keys leave markers for a moment (bus.deleted_key_ttl), then nothing.
            return (await p.bus.usage()).storage <= baseline.storage + SLACK

        try:
            await wait_for(
                settled, timeout=30 + versions // 10, interval=0.5, what="the store to return to its baseline"
            )
        except AssertionError:
            for name in sorted(await p.bus.stream_names()):  # what is left, for the failure's reader
                state = await p.bus.stream(name).info()
                print(f"left in {name}: {state.messages} messages, {state.bytes} bytes")
            raise

        after = await p.bus.usage()
        per_version = (loaded.storage - baseline.storage) / versions
        tally.report(
            versions=versions,
            deploy_ms_avg=round(1000 * sum(deploy_seconds) / len(deploy_seconds), 1),
            bytes_per_version=round(per_version),
            consumers_per_version=(loaded.consumers - baseline.consumers) / versions,
            streams_per_version=(loaded.streams - baseline.streams) / versions,
            reserved=f"{baseline.reserved_storage}->{loaded.reserved_storage}->{after.reserved_storage}",
            stored=f"{baseline.storage}->{loaded.storage}->{after.storage}",
            streams=f"{baseline.streams}->{loaded.streams}->{after.streams}",
            consumers=f"{baseline.consumers}->{loaded.consumers}->{after.consumers}",
        )
        tally.assert_exactly_once()
        assert (after.reserved_storage, after.streams, after.consumers) == (
            baseline.reserved_storage,
            baseline.streams,
            baseline.consumers,
        )
