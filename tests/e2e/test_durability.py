"""The durable buffer: queued requests survive the platform being killed, and 202'd results are found
on any invocation node.

The platform runs as child processes (``nvcf-mono run``) against a NATS server of the test; the
cluster agent is the scripted one in this process (it launches a real worker and echo server).
"""

from __future__ import annotations

import json
import logging
import os
import signal
from pathlib import Path

import aiohttp
import anyio
import anyio.to_thread
import pytest

from nvcf_mono.auth.secret import PlatformSecret
from nvcf_mono.bus.nats import open_nats_bus
from nvcf_mono.config.model import BusSettings
from nvcf_mono.metrics import Metrics
from nvcf_mono.ports import spare_port
from nvcf_mono.testing.nats_server import NatsServer
from nvcf_mono.testing.platform import Api, wait_for
from nvcf_mono.testing.running import ECHO_FUNCTION
from nvcf_mono.testing.scripted_agent import ProcessLauncher, ScriptedAgent, gpu_inventory

from .cli import Platform, cli_env


def _node(
    nats: NatsServer, state: Path, secret: Path, role: str, http_port: int, grpc_port: int, *, autoscaler: bool = True
) -> Platform:
    args = [
        "run",
        "--role",
        role,
        "--state-dir",
        str(state),
        "--set",
        f"bus.url={nats.url}",
        "--set",
        f"plugins.auth.secret_file={secret}",
        "--set",
        f"http.port={http_port}",
        "--set",
        f"grpc.port={grpc_port}",
        "--set",
        f"node.id={state.name}",
        "--set",
        "plugins.compute.enabled=false",
        "--set",
        "plugins.control.reconcile.interval=0.5",
        "--set",
        "plugins.control.autoscaler.interval=0.5",
        "--set",
        f"plugins.control.autoscaler.enabled={str(autoscaler).lower()}",
    ]
    return Platform(args, state, env=cli_env())


@pytest.mark.slow
async def test_queued_requests_survive_a_killed_platform(tmp_path: Path) -> None:
    nats = NatsServer().start()
    secret = tmp_path / "platform-secret"
    PlatformSecret.generate().write(secret)
    ports = (spare_port(), spare_port())
    # No autoscaler at first: the requests below must wait with nobody to serve them.
    first = _node(nats, tmp_path / "a", secret, "all-in-one", *ports, autoscaler=False)
    other = _node(nats, tmp_path / "b", secret, "invocation", spare_port(), spare_port())
    nodes = [first, other]
    try:
        ep = await anyio.to_thread.run_sync(first.wait_ready)
        ep_b = await anyio.to_thread.run_sync(other.wait_ready)
        admin_token = ep["credentials"]["admin_token"]
        async with (
            open_nats_bus(
                BusSettings(connect_retry_for=10.0),
                servers=[nats.url],
                name="tests",
                metrics=Metrics(),
                log=logging.getLogger("tests.bus"),
            ) as bus,
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=100)) as session,
            anyio.create_task_group() as tg,
        ):
            launcher = ProcessLauncher(tmp_path / "instances", environ=dict(os.environ))
            agent = ScriptedAgent(
                bus,
                cluster_id="6b1e4d3a-58a1-4a5e-9d58-2a1c0f0000d1",
                cluster_name="local",
                gpus=[gpu_inventory("H100", 8)],
                behaviour="launch",
                launcher=launcher,
            )
            await tg.start(agent.run)
            admin = Api(session, ep["api_url"], admin_token, timeout=60)
            key = await admin.post(
                "/v1/keys",
                {
                    "description": "durability",
                    "authorizations": {
                        "policies": [
                            {"scopes": ["invoke_function"], "resources": [{"id": "*", "type": "account-functions"}]}
                        ]
                    },
                },
            )
            assert key.status == 200, key.body
            client = admin.as_(key.json["value"])
            fn = (await admin.post("/v2/nvcf/functions", ECHO_FUNCTION)).json["function"]
            d = f"/v2/nvcf/deployments/functions/{fn['id']}/versions/{fn['versionId']}"
            spec = {
                "gpu": "H100",
                "instanceType": "ON-PREM.GPU.H100_1x",
                "minInstances": 0,
                "maxInstances": 1,
                "maxRequestConcurrency": 16,
            }
            dep = (await admin.post(d, {"deploymentSpecifications": [spec]})).json["deployment"]
            assert dep["functionStatus"] == "ACTIVE"

            # 500 requests with nobody to serve them: each answers 202 and waits in the stream.
            ids: dict[str, str] = {}

            async def enqueue(i: int) -> None:
                reply = await client.post(
                    f"/v2/nvcf/pexec/functions/{fn['id']}",
                    {"message": f"m{i}"},
                    headers={"NVCF-POLL-SECONDS": "1"},
                )
                assert reply.status == 202, (reply.status, reply.body)
                ids[reply.headers["NVCF-REQID"]] = f"m{i}"

            limit = anyio.Semaphore(125)  # each enqueue waits its 1 s poll: 4 s for the 500

            async def bounded(i: int) -> None:
                async with limit:
                    await enqueue(i)

            async with anyio.create_task_group() as senders:
                for i in range(500):
                    senders.start_soon(bounded, i)
            assert len(ids) == 500

            # The platform dies hard, and comes back on the same state and ports.
            first.signal(signal.SIGKILL)
            await anyio.to_thread.run_sync(first.wait)
            first.stop()
            restarted = _node(nats, tmp_path / "a", secret, "all-in-one", *ports)
            nodes.append(restarted)
            await anyio.to_thread.run_sync(restarted.wait_ready)

            # Back with its autoscaler: it sees the buffered requests (no wake-up was ever sent for them),
            # scales the version from zero, and the instance drains the buffer.

            results: dict[str, bytes] = {}
            polls = [client, client.as_(key.json["value"])]
            polls[1].base = ep_b["invocation_url"]

            async def collect(request_id: str, n: int) -> None:
                api = polls[n % 2]  # half the results are fetched from the other invocation node

                async def done() -> bool:
                    reply = await api.get(f"/v2/nvcf/pexec/status/{request_id}", headers={"NVCF-POLL-SECONDS": "5"})
                    if reply.status == 200:
                        results[request_id] = reply.body
                        return True
                    assert reply.status == 202, (reply.status, reply.body)
                    return False

                await wait_for(done, timeout=120, what=f"the result of {request_id}")

            async def bounded_collect(request_id: str, n: int) -> None:
                async with limit:
                    await collect(request_id, n)

            async with anyio.create_task_group() as pollers:
                for n, request_id in enumerate(ids):
                    pollers.start_soon(bounded_collect, request_id, n)
            assert set(results) == set(ids)
            for request_id, message in ids.items():
                assert json.loads(results[request_id])["message"] == message
            # Fetched once: the next poll says 404.
            again = await client.get(f"/v2/nvcf/pexec/status/{next(iter(ids))}")
            assert again.status == 404
            tg.cancel_scope.cancel()
    finally:
        for node in nodes:
            node.stop()
        nats.close()
