"""``kill -9`` of the whole platform with requests queued, then a restart on other ports.

The new host takes the running instances over; their workers, started with the old gRPC address,
follow the platform to its new one (the agent rewrites their address file), and every request
that was accepted is answered exactly once.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import aiohttp
import anyio
import anyio.to_thread
import pytest

from nvcf_mono.testing.platform import FAST as CONTROL_FAST
from nvcf_mono.testing.platform import Api
from tests.chaos.tally import Tally, scaled
from tests.e2e.cli import Platform, cli_env
from tests.integration.compute.conftest import (
    CLUSTER_A,
    FAST,
    all_gone,
    cluster,
    cluster_pids,
    environ_of,
    function,
    spec,
)

pytestmark = [pytest.mark.slow, pytest.mark.chaos, pytest.mark.e2e]


def _host(state: Path, *, keep_instances: bool) -> Platform:
    sets = {
        **CONTROL_FAST,
        **FAST,
        "http.port": "0",
        "grpc.port": "0",  # a free port each start: the restart is elsewhere
        "embedded_nats.port": "0",
        "plugins.compute.local.stop_instances_on_shutdown": str(not keep_instances).lower(),
        # What the killed host had handed to a worker comes back after ack_wait: seconds here, not 30.
        "plugins.invocation.ack_wait": "4",
        "plugins.invocation.keepalive": "1",
        "plugins.compute.clusters": json.dumps([cluster("local", CLUSTER_A)]),
    }
    args = ["run", "--state-dir", str(state)]
    for key, value in sets.items():
        args += ["--set", f"{key}={value}"]
    return Platform(args, state, env=cli_env())


async def test_requests_queued_at_a_kill_are_answered_after_a_restart_on_other_ports(tmp_path: Path) -> None:
    tally = Tally("restart-elsewhere")
    state = tmp_path / "state"
    first = _host(state, keep_instances=True)
    second: Platform | None = None
    try:
        doc = await anyio.to_thread.run_sync(first.wait_ready)
        async with aiohttp.ClientSession() as session:
            admin = Api(session, doc["api_url"], doc["credentials"]["admin_token"], timeout=60)
            key = Api(session, doc["invocation_url"], doc["credentials"]["api_key"], timeout=60)
            fid = await _deploy(admin)
            accepted: dict[str, str] = {}

            async def submit(i: int) -> None:
                token = f"q{i}"
                tally.sent += 1
                reply = await key.post(
                    f"/v2/nvcf/pexec/functions/{fid}",
                    {"message": token, "delay": 0.3},
                    headers={"NVCF-POLL-SECONDS": "1"},
                )
                if reply.status == 200:
                    tally.accepted.add(token)
                    tally.answered(token, right=reply.json["message"] == token)
                    return
                assert reply.status == 202, reply.body
                tally.accepted.add(token)
                accepted[reply.headers["NVCF-REQID"]] = token

            async with anyio.create_task_group() as tg:
                for i in range(scaled(40)):
                    tg.start_soon(submit, i)
            assert len(accepted) > 10, "too few requests were still queued at the kill"
            instance_pids = pids_of(state)
            first.signal(signal.SIGKILL)
            await anyio.to_thread.run_sync(first.wait)
            first_log = first.stderr()  # the second host writes the same file

        second = _host(state, keep_instances=False)
        doc2 = await anyio.to_thread.run_sync(second.wait_ready)
        assert doc2["grpc_url"] != doc["grpc_url"], "the restart must listen elsewhere"
        async with aiohttp.ClientSession() as session:
            key = Api(session, doc2["invocation_url"], doc2["credentials"]["api_key"], timeout=60)

            async def follow(request_id: str, token: str) -> None:
                while True:
                    reply = await key.get(f"/v2/nvcf/pexec/status/{request_id}", headers={"NVCF-POLL-SECONDS": "10"})
                    if reply.status == 202:
                        continue
                    if reply.status != 200:
                        tally.failed(reply.status, reply.body.decode(errors="replace"))
                    tally.answered(token, right=reply.status == 200 and reply.json["message"] == token)
                    return

            try:
                with anyio.fail_after(120):
                    async with anyio.create_task_group() as tg:
                        for request_id, token in accepted.items():
                            tg.start_soon(follow, request_id, token)
            except TimeoutError:
                unanswered = sorted(
                    (t, r) for r, t in accepted.items() if t not in tally.answers and t not in tally.wrong
                )
                _warnings(state, first_log, second)
                raise AssertionError(f"not answered within 120 s of the restart: {unanswered}") from None
            # The instances were taken over, not started again.
            assert set(pids_of(state)) & set(instance_pids)
        tally.report(queued_at_kill=len(accepted))
        if tally.wrong or tally.errors:
            _warnings(state, first_log, second)
        tally.assert_exactly_once()
        assert not tally.errors
        second.signal(signal.SIGTERM)
        assert await anyio.to_thread.run_sync(second.wait) == 0
        await all_gone(instance_pids)
        # The workers that lost the first host drained and stopped cleanly when the second stopped them.
        for log in state.glob("plugins/compute/*/instances/*/worker.log"):
            assert "Traceback" not in log.read_text(errors="replace"), log.read_text(errors="replace")[-3000:]
    finally:
        for host in (first, second):
            if host is not None:
                host.stop()


def _warnings(state: Path, first_log: str, second: Platform | None) -> None:
    """What the hosts and the instances' workers warned about, beside the failure (shown with the test's output)."""
    logs = {"first host": first_log, "second host": second.stderr() if second is not None else ""}
    for path in sorted(state.glob("plugins/compute/*/instances/*/worker.log")):
        logs[f"worker {path.parent.name}"] = path.read_text(errors="replace")
    for name, text in logs.items():
        noted = [ln for ln in text.splitlines() if " WARNING " in ln or " ERROR " in ln]
        print(f"--- {name}\n" + "\n".join(noted)[-6000:])


def pids_of(state: Path) -> list[int]:
    """The processes of this test's instances (their environment names the cluster and the state dir)."""
    return [pid for pid in cluster_pids(CLUSTER_A) if str(state) in environ_of(pid).get("SECRETS_FILE", "")]


async def _deploy(admin: Api) -> str:
    created = await admin.post("/v2/nvcf/functions", function())
    assert created.status == 200, created.body
    fid, vid = created.json["function"]["id"], created.json["function"]["versionId"]
    d = f"/v2/nvcf/deployments/functions/{fid}/versions/{vid}"
    assert (await admin.post(d, {"deploymentSpecifications": [spec(max_instances=1)]})).status == 200

    async def active() -> bool:
        return bool((await admin.get(d)).json["deployment"]["functionStatus"] == "ACTIVE")

    with anyio.fail_after(60):
        while not await active():
            await anyio.sleep(0.2)
    return str(fid)
