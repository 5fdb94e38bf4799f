"""Thousands of versions on the embedded defaults: what each costs, and that nothing stays behind.

Every version is created, deployed at min 0, invoked once (the request waits: nothing serves it),
undeployed and deleted; each waiting caller is answered (404: undeployed before it ran). Used by
``tests/chaos/test_many_versions.py`` (which asserts) and ``bench/versions.py`` (which prints).
"""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import attrs

from nvcf_mono.bus.api import StoreUsage
from nvcf_mono.contracts import subjects
from nvcf_mono.models.account import DEFAULT_ACCOUNT
from nvcf_mono.testing.platform import Api, wait_for
from nvcf_mono.testing.running import ECHO_FUNCTION, agent, platform
from nvcf_mono.testing.scripted_agent import gpu_inventory
from tests.chaos.tally import Tally

FAST_RETIRE = {
    "plugins.invocation.sweep_interval": "0.5",
    "plugins.invocation.retired_queue_grace": "1",
    "bus.deleted_key_ttl": "2",
}
#: What the platform's own housekeeping may add meanwhile (cluster heartbeats, rate-limit counters).
SLACK = 16 * 1024


@attrs.define
class Figures:
    """What one run measured."""

    versions: int
    tally: Tally
    baseline: StoreUsage
    loaded: StoreUsage
    after: StoreUsage
    deploy_seconds: list[float]
    phases: dict[str, float]

    def line(self) -> str:
        n = self.versions
        return self.tally.report(
            versions=n,
            deploy_ms_avg=round(1000 * sum(self.deploy_seconds) / len(self.deploy_seconds), 1),
            bytes_per_version=round((self.loaded.storage - self.baseline.storage) / n),
            consumers_per_version=(self.loaded.consumers - self.baseline.consumers) / n,
            streams_per_version=(self.loaded.streams - self.baseline.streams) / n,
            reserved=f"{self.baseline.reserved_storage}->{self.loaded.reserved_storage}->{self.after.reserved_storage}",
            stored=f"{self.baseline.storage}->{self.loaded.storage}->{self.after.storage}",
            streams=f"{self.baseline.streams}->{self.loaded.streams}->{self.after.streams}",
            consumers=f"{self.baseline.consumers}->{self.loaded.consumers}->{self.after.consumers}",
            **{k.replace(" ", "_"): f"{v:.1f}s" for k, v in self.phases.items()},
        )


async def many_versions(tmp_path: Path, versions: int) -> Figures:
    """Run the whole scenario with ``versions`` versions; raises if a caller is left unanswered."""
    tally = Tally("versions")
    async with platform(tmp_path, **FAST_RETIRE) as p, agent(p.bus, gpus=[gpu_inventory("H100", 8, nodes=400)]):
        region = p.host.settings.node.region
        api = Api(p.admin.session, p.admin.base, p.admin.token, timeout=60)
        raised = await api.patch(f"/v2/nvcf/accounts/{DEFAULT_ACCOUNT}", {"maxFunctionsAllowed": versions + 10})
        assert raised.status == 200, raised.body
        baseline = await p.bus.usage()
        t0 = time.perf_counter()
        phases: dict[str, float] = {}
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
        phases["created, deployed and invoked"] = time.perf_counter() - t0
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

        phases["undeployed"] = time.perf_counter() - t0

        async def follow(request_id: str, token: str) -> None:
            async with slots:
                while True:
                    reply = await api.get(f"/v2/nvcf/pexec/status/{request_id}", headers={"NVCF-POLL-SECONDS": "5"})
                    if reply.status == 202:
                        continue
                    right = reply.status == 404 and "undeployed before this request ran" in reply.detail
                    tally.answered(token, right=right)
                    if not right:
                        tally.failed(reply.status, reply.body.decode(errors="replace"))
                    return

        with anyio.fail_after(60 + versions // 5):
            async with anyio.create_task_group() as tg:
                for _, _, request_id, token in made:
                    tg.start_soon(follow, request_id, token)

        phases["answered"] = time.perf_counter() - t0

        async def delete(fid: str, vid: str) -> None:
            async with slots:
                gone = await api.delete(f"/v2/nvcf/functions/{fid}/versions/{vid}")
                assert gone.status == 204, gone.body

        async with anyio.create_task_group() as tg:
            for fid, vid, _, _ in made:
                tg.start_soon(delete, fid, vid)

        phases["deleted"] = time.perf_counter() - t0

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
    return Figures(
        versions=versions,
        tally=tally,
        baseline=baseline,
        loaded=loaded,
        after=after,
        deploy_seconds=deploy_seconds,
        phases=phases,
    )
