"""Losing the NATS node that leads a version's request stream, under load, on a 3-node JetStream cluster.

Publishing to a stream whose leader died used to fail the caller with a 500 and drop the request.
Now the platform retries until a new leader answers (the request id keeps it one request), and a
caller is only ever answered 200 (run exactly once) or 503 with Retry-After (not run).
"""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from nvcf_mono.contracts import subjects
from nvcf_mono.testing.nats_server import NatsCluster, raw_client
from nvcf_mono.testing.platform import Api
from nvcf_mono.testing.running import deployed, launching_agent, platform
from tests.chaos.tally import Tally, scaled

pytestmark = [pytest.mark.slow, pytest.mark.chaos]


async def _leader(url: str, stream: str) -> str:
    nc = await raw_client(url)
    try:
        reply = await nc.request(f"$JS.API.STREAM.INFO.{stream}", b"", timeout=5)
        return str(json.loads(reply.data)["cluster"]["leader"])
    finally:
        await nc.close()


async def test_losing_the_stream_leader_loses_no_accepted_request(tmp_path: Path) -> None:
    tally = Tally("nats-leader-loss")
    cluster = NatsCluster().start()
    try:
        settings = {"bus.url": cluster.urls, "bus.stream_replicas": "3"}
        async with platform(tmp_path, **settings) as p, launching_agent(p, tmp_path / "instances"):
            fid, vid = await deployed(p.admin, concurrency=8)
            api = Api(p.key.session, p.key.base, p.key.token, timeout=60)
            region = p.host.settings.node.region
            stream = subjects.request_stream(region, vid)
            warm = await api.post(f"/v2/nvcf/pexec/functions/{fid}", {"message": "warm"})
            assert warm.status == 200, warm.body
            leader = await _leader(cluster.nodes[0].url, stream)
            survivor = next(n for n in cluster.nodes if n is not cluster.node(leader))
            killed = anyio.Event()

            async def call(i: int) -> None:
                token = f"n{i}"
                tally.sent += 1
                reply = await api.post(f"/v2/nvcf/pexec/functions/{fid}", {"message": token, "delay": 0.05})
                if reply.status == 503:
                    assert reply.headers.get("Retry-After"), reply.headers
                    tally.errors[503] += 1  # refused cleanly: not accepted, not run
                    return
                assert reply.status == 200, (reply.status, reply.body)
                tally.accepted.add(token)
                tally.answered(token, right=reply.json["message"] == token)

            async def kill_the_leader() -> None:
                await anyio.sleep(0.5)
                cluster.node(leader).kill()
                killed.set()

            slots = anyio.Semaphore(8)

            async def bounded(i: int) -> None:
                async with slots:
                    await call(i)

            with anyio.fail_after(180):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(kill_the_leader)
                    for i in range(scaled(300)):
                        tg.start_soon(bounded, i)
            assert killed.is_set()
            new_leader = await _leader(survivor.url, stream)
            tally.report(killed=leader, new_leader=new_leader)
            assert new_leader != leader
            tally.assert_exactly_once()
            # A leader election takes seconds, well inside plugins.invocation.publish_patience: every
            # request waits it out rather than being refused.
            assert not tally.errors
    finally:
        cluster.close()
