"""The invocation node that holds a caller dies mid-request: the result is not lost to the caller.

The request was being served by an instance whose worker is connected to another node; its answer
finds nobody at the dead node and is kept as a result. The caller, who never got a 202 (so never
learned the request id), retries with the same ``Idempotency-Key`` on the other node and gets that
result, under the same request id (it is not invoked a second time).
"""

from __future__ import annotations

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
from tests.chaos.tally import Tally
from tests.e2e.cli import Platform, cli_env

pytestmark = [pytest.mark.slow, pytest.mark.chaos, pytest.mark.e2e]


def _node(nats: NatsServer, state: Path, secret: Path, role: str, grpc_port: int, worker_address: str) -> Platform:
    sets = {
        "bus.url": nats.url,
        "plugins.auth.secret_file": str(secret),
        "http.port": "0",
        "grpc.port": str(grpc_port),
        "node.id": state.name,
        "plugins.compute.enabled": "false",
        "plugins.control.reconcile.interval": "0.5",
        "plugins.control.autoscaler.interval": "0.5",
        # Instances dial the other node: this one may die while they serve its callers.
        "plugins.control.worker_grpc_address": worker_address,
    }
    args = ["run", "--role", role, "--state-dir", str(state)]
    for key, value in sets.items():
        args += ["--set", f"{key}={value}"]
    return Platform(args, state, env=cli_env())


async def test_a_caller_recovers_its_result_after_its_node_died(tmp_path: Path) -> None:
    tally = Tally("invocation-node-loss")
    nats = NatsServer().start()
    secret = tmp_path / "platform-secret"
    PlatformSecret.generate().write(secret)
    grpc_b = spare_port()
    a = _node(nats, tmp_path / "a", secret, "all-in-one", spare_port(), f"127.0.0.1:{grpc_b}")
    b = _node(nats, tmp_path / "b", secret, "invocation", grpc_b, f"127.0.0.1:{grpc_b}")
    try:
        ep_a = await anyio.to_thread.run_sync(a.wait_ready)
        ep_b = await anyio.to_thread.run_sync(b.wait_ready)
        async with (
            open_nats_bus(
                BusSettings(connect_retry_for=10.0),
                servers=[nats.url],
                name="tests",
                metrics=Metrics(),
                log=logging.getLogger("tests.bus"),
            ) as bus,
            aiohttp.ClientSession() as session,
            anyio.create_task_group() as tg,
        ):
            agent = ScriptedAgent(
                bus,
                cluster_id="6b1e4d3a-58a1-4a5e-9d58-2a1c0f0000e1",
                cluster_name="local",
                gpus=[gpu_inventory("H100", 8)],
                behaviour="launch",
                launcher=ProcessLauncher(tmp_path / "instances", environ=dict(os.environ)),
            )
            await tg.start(agent.run)
            admin = Api(session, ep_a["api_url"], ep_a["credentials"]["admin_token"], timeout=60)
            fn = (await admin.post("/v2/nvcf/functions", ECHO_FUNCTION)).json["function"]
            d = f"/v2/nvcf/deployments/functions/{fn['id']}/versions/{fn['versionId']}"
            spec = {"gpu": "H100", "instanceType": "ON-PREM.GPU.H100_1x", "minInstances": 1, "maxInstances": 1}
            assert (await admin.post(d, {"deploymentSpecifications": [spec]})).status == 200

            async def active() -> bool:
                return bool((await admin.get(d)).json["deployment"]["functionStatus"] == "ACTIVE")

            await wait_for(active, timeout=60, what="ACTIVE")
            token = ep_a["credentials"]["api_key"]
            on_a = Api(session, ep_a["invocation_url"], token, timeout=60)
            on_b = Api(session, ep_b["invocation_url"], token, timeout=60)
            path = f"/v2/nvcf/pexec/functions/{fn['id']}"
            warm = await on_b.post(path, {"message": "warm"})
            assert warm.status == 200, warm.body
            headers = {"Idempotency-Key": "order-42"}
            tally.sent += 1

            async def die_mid_request() -> None:
                await anyio.sleep(1.0)
                a.signal(signal.SIGKILL)

            lost_connection = False
            async with anyio.create_task_group() as inner:
                inner.start_soon(die_mid_request)
                try:
                    await on_a.post(path, {"message": "once", "delay": 3.0}, headers=headers)
                except aiohttp.ClientError:
                    lost_connection = True
            assert lost_connection, "the caller's node should have died before it answered"
            tally.accepted.add("once")
            # The retry on the surviving node names the same request and gets its result.
            retry = await on_b.post(path, {"message": "once", "delay": 3.0}, headers=headers)
            assert retry.status == 200, retry.body
            tally.answered("once", right=retry.json["message"] == "once")
            first_id = retry.headers["NVCF-REQID"]
            again = await on_b.post(path, {"message": "once", "delay": 3.0}, headers=headers)
            assert again.status == 200 and again.headers["NVCF-REQID"] == first_id
            assert again.json["reqid"] == first_id  # the answer of that one request
            tally.report()
            tally.assert_exactly_once()
            tg.cancel_scope.cancel()
    finally:
        for node in (a, b):
            node.stop()
        nats.close()
