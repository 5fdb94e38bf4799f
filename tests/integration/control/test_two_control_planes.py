"""Two control-plane processes on one bus: one leader places, both serve the API, no double placement."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import aiohttp
import anyio

from nvcf_mono.bus.nats import NatsBus, open_nats_bus
from nvcf_mono.config.model import BusSettings
from nvcf_mono.host import Host
from nvcf_mono.metrics import Metrics
from nvcf_mono.testing.host import running_host
from nvcf_mono.testing.nats_server import NatsServer
from nvcf_mono.testing.platform import Api, credentials, platform_config, wait_for, wait_status
from nvcf_mono.testing.scripted_agent import gpu_inventory

from .conftest import CONTAINER_FUNCTION, agent
from .test_lifecycle import spec


@asynccontextmanager
async def two_control_planes(tmp_path: Path) -> AsyncIterator[tuple[NatsServer, NatsBus, list[Host], list[Api]]]:
    nats = NatsServer().start()
    try:
        secret = tmp_path / "platform-secret"
        async with AsyncExitStack() as stack:
            hosts = []
            for name in ("cp-a", "cp-b"):
                config = platform_config(
                    tmp_path / name, nats_url=nats.url, role="control", node=name, secret_file=secret
                )
                hosts.append(await stack.enter_async_context(running_host(config)))
            session = await stack.enter_async_context(aiohttp.ClientSession())
            apis = [Api(session, h.endpoints.url, credentials(h)["admin_token"]) for h in hosts]
            bus = await stack.enter_async_context(
                open_nats_bus(
                    BusSettings(connect_retry_for=5.0),
                    servers=[nats.url],
                    name="tests",
                    metrics=Metrics(),
                    log=logging.getLogger("tests.bus"),
                )
            )
            yield nats, bus, hosts, apis
    finally:
        nats.close()


async def test_concurrent_changes_across_two_processes_place_exactly_once(tmp_path: Path) -> None:
    big = [gpu_inventory("H100", 8, nodes=4)]
    async with two_control_planes(tmp_path) as (_, bus, _hosts, (a, b)), agent(bus, gpus=big) as fake:
        assert (await a.get("/v2/nvcf/functions")).status == 200
        # The admin token is derived from the shared platform secret: the same on both nodes.
        assert a.token == b.token

        # 20 versions deployed at once, half through each process: 20 creation messages, no more.
        fn = (await a.post("/v2/nvcf/functions", CONTAINER_FUNCTION)).json["function"]
        # Read your writes across nodes: the other process finds the function at once (its copy catches
        # up before it would say 404).
        assert (await b.get(f"/v2/nvcf/functions/{fn['id']}/versions")).status == 200
        paths = [f"/v2/nvcf/deployments/functions/{fn['id']}/versions/{fn['versionId']}"]
        for _ in range(19):
            v = (await b.post(f"/v2/nvcf/functions/{fn['id']}/versions", CONTAINER_FUNCTION)).json["function"]
            paths.append(f"/v2/nvcf/deployments/functions/{fn['id']}/versions/{v['versionId']}")
        async with anyio.create_task_group() as tg:
            for i, d in enumerate(paths):
                api = a if i % 2 else b
                tg.start_soon(api.post, d, {"deploymentSpecifications": [spec(1, 4)]})
        for d in paths:
            await wait_status(a, d, "ACTIVE", timeout=30)
        assert len(fake.creations) == 20

        # The same version deployed through both processes at once: exactly one wins.
        late = (await a.post(f"/v2/nvcf/functions/{fn['id']}/versions", CONTAINER_FUNCTION)).json["function"]
        d = f"/v2/nvcf/deployments/functions/{fn['id']}/versions/{late['versionId']}"
        replies = []

        async def deploy(api: Api) -> None:
            replies.append(await api.post(d, {"deploymentSpecifications": [spec(1, 5)]}))

        async with anyio.create_task_group() as tg:
            for api in (a, b, a, b):
                tg.start_soon(deploy, api)
        assert sorted(r.status for r in replies) == [200, 400, 400, 400]
        dep = next(r for r in replies if r.status == 200).json["deployment"]
        await wait_status(b, d, "ACTIVE")

        # 20 concurrent scale changes to the same spec through both processes: each asks for 3
        # instances; the ledger's CAS and the single leader make that exactly 2 more messages.
        patch = f"/v2/nvcf/deployments/{dep['deploymentId']}/gpu-specifications/"
        patch += dep["deploymentSpecifications"][0]["gpuSpecificationId"]
        before = len(fake.creations)
        async with anyio.create_task_group() as tg:
            for i in range(20):
                tg.start_soon((a if i % 2 else b).patch, patch, {"minInstances": 3})

        async def three() -> bool:
            return (await a.get(d)).json["deployment"]["deploymentSpecifications"][0]["placement"][
                "runningInstances"
            ] == 3

        await wait_for(three, what="3 running")
        await anyio.sleep(1.0)  # a second leader acting on a stale view would place more in this time
        assert len(fake.creations) - before == 2
        assert len({c.request_id for c in fake.creations}) == len(fake.creations)


async def test_a_new_leader_takes_over_when_the_leader_stops(tmp_path: Path) -> None:
    async with two_control_planes(tmp_path) as (_, bus, hosts, (a, b)), agent(bus) as fake:
        fn = (await a.post("/v2/nvcf/functions", CONTAINER_FUNCTION)).json["function"]
        d = f"/v2/nvcf/deployments/functions/{fn['id']}/versions/{fn['versionId']}"
        dep = (await a.post(d, {"deploymentSpecifications": [spec(1, 4)]})).json["deployment"]
        await wait_status(a, d, "ACTIVE")
        leader = next(i for i, h in enumerate(hosts) if _is_leader(h))
        survivor = (a, b)[1 - leader]
        hosts[leader].request_shutdown()  # releases the lease on the way out
        patch = f"/v2/nvcf/deployments/{dep['deploymentId']}/gpu-specifications/"
        patch += dep["deploymentSpecifications"][0]["gpuSpecificationId"]
        await wait_for(lambda: _leads(hosts[1 - leader]), timeout=15, what="takeover")
        reply = await survivor.patch(patch, {"minInstances": 2})
        assert reply.status == 200

        async def two() -> bool:
            return len(fake.live()) == 2

        await wait_for(two, what="the new leader places")
        await wait_status(survivor, d, "ACTIVE")


def _is_leader(host: Host) -> bool:
    return "nvcf_control_leader 1" in host.metrics.render()


async def _leads(host: Host) -> bool:
    return _is_leader(host)
