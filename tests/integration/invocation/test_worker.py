"""The worker agent (``nvcf-mono worker``) with real processes: input assets, progress reports,
streaming, large bodies, cancellation, health pauses, crashes, and reconnecting to the node.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import logging
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import pytest
from aiohttp import web
from anyio.abc import TaskStatus
from grpclib.const import Cardinality, Handler, Status
from grpclib.exceptions import GRPCError
from grpclib.server import Server, Stream

from nvcf_mono.backoff import Backoff
from nvcf_mono.contracts import buckets, states
from nvcf_mono.contracts.frames import Frame, Request
from nvcf_mono.ports import spare_port
from nvcf_mono.proto.gen.nvcf.worker.v1 import ConnectRequest, ConnectResponse, Drain, NodeMessage
from nvcf_mono.proto.serve_wire import NODE_STOPPING, NodeEnvelope, WorkerEnvelope
from nvcf_mono.testing import echo_server
from nvcf_mono.testing.platform import Api, wait_for
from nvcf_mono.testing.scripted_agent import Launched, ProcessLauncher, ScriptedAgent, gpu_inventory
from nvcf_mono.worker import agent as agent_module
from nvcf_mono.worker.agent import Worker
from nvcf_mono.worker.config import WorkerConfig

from .conftest import ECHO_FUNCTION, Platform, deployed, launching_agent, platform

MiB = 1024 * 1024
TRANSPORT = "plugins.invocation.transport"
#: Workers take requests over the node's gRPC stream, or pull them from NATS themselves.
BOTH_TRANSPORTS = pytest.mark.parametrize("transport", ["grpc", "nats"])


def patient(api: Api, timeout: float = 60.0) -> Api:
    """The same client with a longer deadline (restarts)."""
    return Api(api.session, api.base, api.token, timeout=timeout, checker=api.checker)


def only_instance(fake: ScriptedAgent) -> Launched:
    assert fake.launcher is not None
    (launched,) = fake.launcher.running.values()
    return launched


async def worker_health(session: aiohttp.ClientSession, launched: Launched) -> tuple[int, dict[str, Any]]:
    url = f"http://127.0.0.1:{launched.health_port}/v1/health/ready"
    with anyio.fail_after(5):
        async with session.get(url) as resp:
            return resp.status, await resp.json()


async def echo_call(session: aiohttp.ClientSession, launched: Launched, method: str, path: str) -> Any:
    with anyio.fail_after(5):
        async with session.request(method, f"http://127.0.0.1:{launched.inference_port}{path}") as resp:
            return await resp.json()


# ---- input assets ------------------------------------------------------------------------------------


async def upload_asset(p: Platform, content: bytes) -> str:
    created = await p.key.post(
        "/v2/nvcf/assets", {"contentType": "application/octet-stream", "description": "input for a test"}
    )
    assert created.status == 200, created.body
    with anyio.fail_after(10):
        async with p.key.session.put(
            created.json["uploadUrl"], data=content, headers={"Content-Type": "application/octet-stream"}
        ) as resp:
            assert resp.status == 200, await resp.text()
    return str(created.json["assetId"])


@pytest.mark.slow
async def test_input_assets_are_in_the_asset_dir_for_the_call_and_gone_after(tmp_path: Path) -> None:
    workdir = tmp_path / "instances"
    async with platform(tmp_path) as p, launching_agent(p, workdir):
        fid, _ = await deployed(p.admin)
        first, second = os.urandom(300_000), b"small asset"
        ids = [await upload_asset(p, first), await upload_asset(p, second)]
        reply = await p.key.post(
            f"/v2/nvcf/pexec/functions/{fid}",
            data=b"raw body",
            headers={"NVCF-INPUT-ASSET-REFERENCES": ", ".join(ids), "Content-Type": "application/octet-stream"},
        )
        assert reply.status == 200, reply.body
        assert reply.body == b"raw body"
        request_id = reply.headers["NVCF-REQID"]
        # What the inference server saw: the ids, the directory, and each file's content.
        assert reply.headers["NVCF-FUNCTION-ASSET-IDS"] == ",".join(ids)
        asset_dir = Path(reply.headers["NVCF-ASSET-DIR"])
        assert asset_dir == workdir / "assets" / request_id
        digests = dict(item.split("=") for item in reply.headers["X-Echo-Assets"].split(","))
        assert digests == {
            ids[0]: hashlib.sha256(first).hexdigest(),
            ids[1]: hashlib.sha256(second).hexdigest(),
        }

        async def cleaned_up() -> bool:
            return not await anyio.Path(asset_dir).exists()

        await wait_for(cleaned_up, timeout=10, what="the request's asset directory to be removed")


@pytest.mark.slow
async def test_a_failed_asset_download_is_the_workers_500_problem(tmp_path: Path) -> None:
    workdir = tmp_path / "instances"
    async with platform(tmp_path) as p, launching_agent(p, workdir):
        fid, _ = await deployed(p.admin)
        asset_id = await upload_asset(p, b"soon gone")
        # The record says uploaded (the node accepts the reference) but the content is gone.
        content = p.bus.objects(buckets.ASSET_CONTENT.name)
        (stored,) = [o for o in await content.list() if o.name.endswith(f"/{asset_id}")]
        assert await content.delete(stored.name)
        reply = await p.key.post(
            f"/v2/nvcf/pexec/functions/{fid}",
            {"message": "never called"},
            headers={"NVCF-INPUT-ASSET-REFERENCES": asset_id},
        )
        assert reply.status == 500, reply.body
        assert reply.headers["Content-Type"].startswith("application/problem+json")
        assert reply.headers["NVCF-STATUS"] == "errored"
        assert reply.json == {
            "type": "urn:nvcf-worker-service:problem-details:internal-server-error",
            "title": "Internal Server Error",
            "status": 500,
            "detail": "Internal error while downloading assets",
        }
        asset_dir = workdir / "assets" / reply.headers["NVCF-REQID"]

        async def cleaned_up() -> bool:
            return not await anyio.Path(asset_dir).exists()

        await wait_for(cleaned_up, timeout=10, what="the request's asset directory to be removed")


# ---- progress --------------------------------------------------------------------------------------


@BOTH_TRANSPORTS
@pytest.mark.slow
async def test_progress_reports_answer_202_with_the_percentage_until_the_result(tmp_path: Path, transport: str) -> None:
    workdir = tmp_path / "instances"
    async with platform(tmp_path, **{TRANSPORT: transport}) as p, launching_agent(p, workdir):
        fid, _ = await deployed(p.admin)
        reply = await p.key.post(
            f"/v2/nvcf/pexec/functions/{fid}", {"message": "done", "progress": [25, 75], "delay": 0.8}
        )
        assert reply.status == 202, reply.body
        assert reply.headers["NVCF-PERCENT-COMPLETE"] == "25"
        assert reply.headers["NVCF-STATUS"] == "in-progress"
        assert reply.headers["Content-Type"].startswith("application/json")
        assert reply.json == {"step": 0}
        request_id = reply.headers["NVCF-REQID"]
        assert (workdir / "responses" / request_id).is_dir()  # the inference server's output dir, while it runs
        seen: list[tuple[int, str | None, Any]] = []
        with anyio.fail_after(20):
            while True:
                poll = await p.key.get(f"/v2/nvcf/pexec/status/{request_id}", headers={"NVCF-POLL-SECONDS": "5"})
                seen.append((poll.status, poll.headers.get("NVCF-PERCENT-COMPLETE"), poll.json))
                if poll.status != 202:
                    break
        assert seen[0] == (202, "75", {"step": 1}), seen
        assert seen[-1][0] == 200 and seen[-1][2]["message"] == "done", seen
        assert (await p.key.get(f"/v2/nvcf/pexec/status/{request_id}")).status == 404

        async def cleaned_up() -> bool:
            return not await anyio.Path(workdir / "responses" / request_id).exists()

        await wait_for(cleaned_up, timeout=10, what="the request's output directory to be removed")


# ---- streaming and large bodies ----------------------------------------------------------------------


@BOTH_TRANSPORTS
@pytest.mark.slow
async def test_server_sent_events_reach_the_client_as_they_are_written(tmp_path: Path, transport: str) -> None:
    async with platform(tmp_path, **{TRANSPORT: transport}) as p, launching_agent(p, tmp_path / "instances"):
        fid, _ = await deployed(p.admin)
        arrivals: list[tuple[float, dict[str, Any]]] = []
        with anyio.fail_after(30):
            async with p.key.session.post(
                f"{p.key.base}/v2/nvcf/pexec/functions/{fid}",
                json={"message": "tick", "repeats": 5, "delay": 0.3, "stream": True},
                headers={"Authorization": f"Bearer {p.key.token}", "Accept": "text/event-stream"},
            ) as resp:
                assert resp.status == 200
                assert resp.headers["Content-Type"].startswith("text/event-stream")
                assert resp.headers["NVCF-STATUS"] == "fulfilled" and resp.headers["NVCF-REQID"]
                async for line in resp.content:
                    if line.startswith(b"data: "):
                        arrivals.append((time.monotonic(), json.loads(line[6:])))
        assert [event["index"] for _, event in arrivals] == [0, 1, 2, 3, 4]
        assert all(event["message"] == "tick" for _, event in arrivals)
        # The server writes an event every 0.3 s: the first arrives ~1.2 s before the last is written.
        spread = arrivals[-1][0] - arrivals[0][0]
        assert spread > 0.9, [t - arrivals[0][0] for t, _ in arrivals]
        gaps = [b[0] - a[0] for a, b in itertools.pairwise(arrivals)]
        assert min(gaps) > 0.15, gaps  # one by one, not in a burst at the end


@BOTH_TRANSPORTS
@pytest.mark.slow
async def test_a_stream_that_breaks_off_is_cut_and_its_retry_is_told_why(tmp_path: Path, transport: str) -> None:
    """The server cuts its event stream: the client's response is cut too (never ended as if complete), and
    a retry with the same Idempotency-Key gets a 502 saying why. It once said "frame 0 (attempt 0) where
    4 was due": the node's own problem frame was read as a gap before it was read as a problem."""
    async with platform(tmp_path, **{TRANSPORT: transport}) as p, launching_agent(p, tmp_path / "instances"):
        fid, _ = await deployed(p.admin)
        url = f"{p.key.base}/v2/nvcf/pexec/functions/{fid}"
        # Cut (the worker reads a short body), or after bytes that are not HTTP (the worker cannot read it).
        for how, why in (
            (True, "Broken: "),
            ("garbage", "the inference server's answer broke off: BadResponse"),
        ):
            headers = {
                "Authorization": f"Bearer {p.key.token}",
                "Accept": "text/event-stream",
                "Idempotency-Key": str(how),
            }
            body = {"message": "tick", "repeats": 3, "stream": True, "break": how}
            events = []
            with anyio.fail_after(30), pytest.raises(aiohttp.ClientPayloadError):
                async with p.key.session.post(url, json=body, headers=headers) as resp:
                    assert resp.status == 200
                    async for line in resp.content:
                        if line.startswith(b"data: "):
                            events.append(json.loads(line[6:])["index"])
            assert events == [0, 1, 2]
            with anyio.fail_after(30):
                async with p.key.session.post(url, json=body, headers=headers) as again:
                    doc = await again.json()
            assert again.status == 502, doc
            assert doc["detail"].startswith(f"the response broke off: the instance failed mid-response: {why}"), doc


@BOTH_TRANSPORTS
@pytest.mark.slow
async def test_20_mib_request_and_response_round_trip(tmp_path: Path, transport: str) -> None:
    size = 20 * MiB
    async with platform(tmp_path, **{TRANSPORT: transport}) as p, launching_agent(p, tmp_path / "instances"):
        fid, _ = await deployed(p.admin)
        bytes_fid, _ = await deployed(
            p.admin, {**ECHO_FUNCTION, "name": "bytes", "inferenceUrl": f"/bytes?size={size}"}
        )
        body = os.urandom(size)
        # Compatibility mode off: the bodies themselves come back, not a 302 to a zip of them (bodies over
        # 5 MiB in compatibility mode: test_large_responses.py).
        auth = {"Authorization": f"Bearer {p.key.token}", "NVCF-Feature-Disable-Worker-Compatibility": "true"}
        with anyio.fail_after(60):
            async with p.key.session.post(
                f"{p.key.base}/v2/nvcf/pexec/functions/{fid}",
                data=io.BytesIO(body),  # the object store path: far above the inline limit
                headers={**auth, "Content-Type": "application/octet-stream"},
            ) as resp:
                echoed = await resp.read()
                assert resp.status == 200, echoed[:500]
                assert resp.headers["X-Echo-Sha256"] == hashlib.sha256(body).hexdigest()  # what the server got
        assert len(echoed) == size and hashlib.sha256(echoed).digest() == hashlib.sha256(body).digest()
        with anyio.fail_after(60):
            async with p.key.session.post(f"{p.key.base}/v2/nvcf/pexec/functions/{bytes_fid}", headers=auth) as resp:
                produced = await resp.read()
                assert resp.status == 200, produced[:500]
                assert len(produced) == size
                assert hashlib.sha256(produced).hexdigest() == resp.headers["X-Echo-Sha256"]


# ---- cancellation ------------------------------------------------------------------------------------


@BOTH_TRANSPORTS
@pytest.mark.slow
async def test_a_client_that_hangs_up_stops_the_call_to_the_inference_server(tmp_path: Path, transport: str) -> None:
    async with platform(tmp_path, **{TRANSPORT: transport}) as p, launching_agent(p, tmp_path / "instances") as fake:
        fid, _ = await deployed(p.admin)
        launched = only_instance(fake)
        session = p.key.session

        async def in_flight(count: int) -> bool:
            return (await worker_health(session, launched))[1]["inFlight"] == count

        started = time.monotonic()
        async with anyio.create_task_group() as tg:

            async def slow_call() -> None:
                async with (
                    aiohttp.ClientSession() as own,
                    own.post(
                        f"{p.key.base}/v2/nvcf/pexec/functions/{fid}",
                        json={"message": "slow", "delay": 60},
                        headers={"Authorization": f"Bearer {p.key.token}"},
                    ) as resp,
                ):
                    await resp.read()

            tg.start_soon(slow_call)
            await wait_for(lambda: in_flight(1), timeout=15, what="the worker to hold the request")
            # The worker's own metrics say the same (Prometheus text on its health port).
            async with session.get(f"http://127.0.0.1:{launched.health_port}/metrics") as resp:
                metrics = await resp.text()
            assert "# TYPE worker_thread_busy_seconds counter" in metrics, metrics
            assert "nvcf_worker_requests_in_flight 1" in metrics and "nvcf_worker_connected 1" in metrics, metrics
            tg.cancel_scope.cancel()  # the client hangs up
        await wait_for(lambda: in_flight(0), timeout=10, what="the worker to stop the call")

        async def recorded() -> list[str]:
            return list((await echo_call(session, launched, "GET", "/cancelled"))["cancelled"])

        cancelled = await wait_for(recorded, timeout=10, what="the inference server to see the call dropped")
        assert len(cancelled) == 1 and cancelled[0]
        assert time.monotonic() - started < 40  # long before the 60 s the call would have taken
        # The instance serves the next request normally.
        reply = await p.key.post(f"/v2/nvcf/pexec/functions/{fid}", {"message": "next"})
        assert reply.status == 200 and reply.json["message"] == "next"


# ---- health ------------------------------------------------------------------------------------------


@BOTH_TRANSPORTS
@pytest.mark.slow
async def test_an_unhealthy_inference_server_pauses_the_worker_and_requests_wait(
    tmp_path: Path, transport: str
) -> None:
    async with platform(tmp_path, **{TRANSPORT: transport}) as p, launching_agent(p, tmp_path / "instances") as fake:
        fid, _ = await deployed(p.admin)
        launched = only_instance(fake)
        session = p.key.session
        assert (await worker_health(session, launched))[0] == 200
        await echo_call(session, launched, "POST", "/health/fail")

        async def not_ready() -> dict[str, Any] | None:
            status, doc = await worker_health(session, launched)
            return doc if status == 503 else None

        doc = await wait_for(not_ready, timeout=10, what="the worker to say it is not ready")
        assert doc["inferenceHealthy"] is False and doc["connected"] is True
        assert "503" in doc["detail"]
        reply = await p.key.post(
            f"/v2/nvcf/pexec/functions/{fid}", {"message": "later"}, headers={"NVCF-POLL-SECONDS": "2"}
        )
        assert reply.status == 202, reply.body  # not served while the server is unhealthy
        request_id = reply.headers["NVCF-REQID"]
        still = await p.key.get(f"/v2/nvcf/pexec/status/{request_id}", headers={"NVCF-POLL-SECONDS": "1"})
        assert still.status == 202
        await echo_call(session, launched, "POST", "/health/recover")

        async def ready() -> bool:
            return (await worker_health(session, launched))[0] == 200

        await wait_for(ready, timeout=10, what="the worker to be ready again")
        result = await p.key.get(f"/v2/nvcf/pexec/status/{request_id}", headers={"NVCF-POLL-SECONDS": "10"})
        assert result.status == 200, result.body
        assert result.json == {"message": "later", "reqid": request_id}


# ---- crashes -----------------------------------------------------------------------------------------


@asynccontextmanager
async def restarting_agent(p: Platform, workdir: Path) -> AsyncIterator[ScriptedAgent]:
    """A launching agent whose instances' inference servers are started again when they exit."""
    launcher = ProcessLauncher(workdir, environ=dict(os.environ), restart_inference=True)
    fake = ScriptedAgent(
        p.bus,
        cluster_id="6b1e4d3a-58a1-4a5e-9d58-2a1c0f000003",
        cluster_name="local",
        gpus=[gpu_inventory("H100", 8)],
        behaviour="launch",
        launcher=launcher,
    )
    async with anyio.create_task_group() as tg:
        await tg.start(fake.run)
        try:
            yield fake
        finally:
            tg.cancel_scope.cancel()


@BOTH_TRANSPORTS
@pytest.mark.slow
async def test_a_request_that_kills_the_inference_server_fails_after_3_deliveries(
    tmp_path: Path, transport: str
) -> None:
    async with platform(tmp_path, **{TRANSPORT: transport}) as p, restarting_agent(p, tmp_path / "instances") as fake:
        fid, vid = await deployed(p.admin, min_instances=2, max_instances=2)

        async def both_running() -> bool:
            return sum(i.state == states.RUNNING for i in fake.instances.values()) == 2

        await wait_for(both_running, timeout=30, what="two running instances")
        assert fake.launcher is not None
        launched = list(fake.launcher.running.values())
        client = patient(p.key)
        reply = await client.post(f"/v2/nvcf/pexec/functions/{fid}", {"crash": True})
        assert reply.status == 500, reply.body
        assert reply.headers["Content-Type"].startswith("application/problem+json")
        assert "3 deliveries" in reply.detail

        async def three_crashes() -> bool:
            return sum(one.restarts for one in launched) == 3

        await wait_for(three_crashes, timeout=20, what="three crashes (one per delivery)")
        # The workers' log lines about it name the request, its function and version.
        rid = reply.headers["NVCF-REQID"]
        lines = [line for one in launched for line in one.log.read_text().splitlines() if f"request {rid}:" in line]
        assert lines and all(line.endswith(f"[request {rid} function {fid} version {vid}]") for line in lines), lines
        after = await client.post(f"/v2/nvcf/pexec/functions/{fid}", {"message": "still here"})
        assert after.status == 200, after.body
        assert after.json["message"] == "still here"
        assert sum(one.restarts for one in launched) == 3  # served without another crash


@BOTH_TRANSPORTS
@pytest.mark.slow
async def test_a_worker_killed_mid_request_leaves_the_request_to_another(tmp_path: Path, transport: str) -> None:
    """SIGKILL the worker holding a request: another instance serves it at once, as the node sees the
    session end and hands back what the worker held (the nats transport's worker pulled it itself and
    told its node), not after the delivery's ack wait (60 s here)."""
    settings = {TRANSPORT: transport, "plugins.invocation.ack_wait": 60}
    async with platform(tmp_path, **settings) as p, launching_agent(p, tmp_path / "instances") as fake:
        fid, _ = await deployed(p.admin, min_instances=2, max_instances=2)

        async def both_running() -> bool:
            return sum(i.state == states.RUNNING for i in fake.instances.values()) == 2

        await wait_for(both_running, timeout=30, what="two running instances")
        assert fake.launcher is not None
        launched = list(fake.launcher.running.values())
        replies: list[Any] = []
        async with anyio.create_task_group() as tg:

            async def call() -> None:
                url = f"/v2/nvcf/pexec/functions/{fid}"
                replies.append(await patient(p.key, timeout=25).post(url, {"message": "survivor", "delay": 1.5}))

            tg.start_soon(call)

            # The node must know the worker holds it (grpc: it handed it over; nats: the worker said so):
            # a worker killed in the moment between pulling and saying so leaves it to the ack wait.
            workers = p.host.plugin("invocation").workers

            async def holder() -> Launched | None:
                for session in list(workers.sessions.values()):
                    if session.in_flight or session.held_remotely:
                        return fake.launcher.running[session.instance_id.removeprefix("0-sr-")]
                return None

            victim = await wait_for(holder, timeout=10, what="the worker holding the request")
            victim.worker.kill()
        (reply,) = replies
        assert reply.status == 200, reply.body
        assert reply.json["message"] == "survivor"
        (survivor,) = [one for one in launched if one is not victim]

        async def served() -> bool:  # counted once the request is settled, just after the client's answer
            return bool((await worker_health(p.key.session, survivor))[1]["served"] == 1)

        await wait_for(served, timeout=10, what="the other instance to count the request served")


# ---- reconnecting ------------------------------------------------------------------------------------

SERVICE = "/nvcf.worker.v1.WorkerService"


class FakeNode:
    """Just enough WorkerService to connect to: refuses the first ``refuse`` ConnectOnce calls."""

    def __init__(self, refuse: int) -> None:
        self.refuse = refuse
        self.connects: list[float] = []
        self.sessions = 0
        #: Set to end every session (the node is going away).
        self.going = anyio.Event()
        #: Set to end every session as a stopping node does: it says so (``leave``) first.
        self.leaving = anyio.Event()
        self.drains = 0

    def __mapping__(self) -> dict[str, Handler]:
        return {
            f"{SERVICE}/ConnectOnce": Handler(
                self.connect_once, Cardinality.UNARY_UNARY, ConnectRequest, ConnectResponse
            ),
            f"{SERVICE}/Serve": Handler(self.serve, Cardinality.STREAM_STREAM, WorkerEnvelope, NodeEnvelope),
        }

    async def connect_once(self, stream: Stream[ConnectRequest, ConnectResponse]) -> None:
        request = await stream.recv_message()
        assert request is not None and request.worker_token == "token"
        self.connects.append(time.monotonic())
        if len(self.connects) <= self.refuse:
            raise GRPCError(Status.UNAVAILABLE, "the node is starting")
        await stream.send_message(ConnectResponse(session_token="session", max_concurrency=1, transport="grpc"))

    async def serve(self, stream: Stream[WorkerEnvelope, NodeEnvelope]) -> None:
        hello = await stream.recv_message()
        assert hello is not None and hello.kind == "hello"
        self.sessions += 1
        going, leaving = self.going, self.leaving  # this session's: a test may set up the next one's
        async with anyio.create_task_group() as tg:

            async def read() -> None:
                async for message in stream:
                    self.drains += message.kind == "drain"
                tg.cancel_scope.cancel()  # the worker ended its side (drained): so does the node

            async def leave() -> None:
                await leaving.wait()
                await stream.send_message(NodeEnvelope(message=NodeMessage(leave=Drain(reason=NODE_STOPPING))))
                tg.cancel_scope.cancel()

            tg.start_soon(read)
            tg.start_soon(leave)
            await going.wait()
            tg.cancel_scope.cancel()
        if going.is_set():
            raise GRPCError(Status.UNAVAILABLE, "the node is shutting down")


@asynccontextmanager
async def node(fake: FakeNode, port: int) -> AsyncIterator[None]:
    server = Server([fake])
    await server.start("127.0.0.1", port)
    try:
        yield
    finally:
        server.close()
        await server.wait_closed()


@asynccontextmanager
async def echo(port: int) -> AsyncIterator[None]:
    runner = web.AppRunner(echo_server.app(), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield
    finally:
        await runner.cleanup()


def worker_config(tmp_path: Path, node_port: int, echo_port: int) -> WorkerConfig:
    """A worker for the echo server on ``echo_port``, dialling the node on ``node_port``."""
    return WorkerConfig(
        worker_token="token",
        grpc_address=f"127.0.0.1:{node_port}",
        function_id="fid",
        function_version_id="fvid",
        function_name="echo",
        nca_id="nca",
        instance_id="instance-1",
        inference_port=echo_port,
        health_port=echo_port,
        health_endpoint="/health",
        health_interval=0.1,
        asset_dir=str(tmp_path / "assets"),
        response_dir=str(tmp_path / "responses"),
    )


async def test_the_worker_reconnects_with_backoff_and_drains(tmp_path: Path) -> None:
    node_port, echo_port = spare_port(), spare_port()
    config = worker_config(tmp_path, node_port, echo_port)
    worker = Worker(config)
    worker.backoff = Backoff(0.1, 0.4, rand=lambda low, high: 1.0)
    fake = FakeNode(refuse=3)

    async def connected(sessions: int) -> bool:
        return worker.state.connected and worker.state.sessions == sessions and fake.sessions == sessions

    stopped = anyio.Event()

    async def run(*, task_status: TaskStatus[None]) -> None:
        await worker.run(task_status=task_status)
        stopped.set()

    async with echo(echo_port), anyio.create_task_group() as tg:
        async with node(fake, node_port):
            await tg.start(run)
            await wait_for(lambda: connected(1), timeout=10, what="the worker to connect")
            # Refused three times: waits of 0.1, 0.2 and 0.4 s between the attempts.
            gaps = [b - a for a, b in itertools.pairwise(fake.connects)]
            assert len(gaps) == 3
            for gap, delay in zip(gaps, (0.1, 0.2, 0.4), strict=True):
                assert gap >= delay * 0.95, gaps
            assert worker.state.ready
            # The node goes away (a restart): the worker is not ready and keeps trying.
            fake.going.set()
            await wait_for(lambda: _false(worker.state.connected), timeout=10, what="the worker to notice")
        assert not worker.state.ready and "not connected" in worker.state.detail
        fake.going = anyio.Event()
        async with node(fake, node_port):
            await wait_for(lambda: connected(2), timeout=10, what="the worker to reconnect")
            assert worker.state.ready and worker.state.detail == ""
            # SIGTERM: the worker says it drains, ends its side, and stops once the node ends the session.
            worker.request_drain()
            with anyio.fail_after(5):
                await stopped.wait()
            assert fake.drains == 1 and not worker.state.ready


async def test_a_worker_whose_node_leaves_in_order_dials_again_at_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A node that says it is stopping (a rolling restart) is no fault: the worker connects again after the
    first step of its backoff, not after the step its earlier failed attempts had reached (it used to wait
    that long, up to 10 s, unless its session had lasted 10 s)."""
    node_port, echo_port = spare_port(), spare_port()
    worker = Worker(worker_config(tmp_path, node_port, echo_port))
    worker.backoff = Backoff(0.1, 10.0, rand=lambda low, high: 1.0)
    fake = FakeNode(refuse=4)  # waits of 0.1, 0.2, 0.4 and 0.8 s: the next step would be 1.6 s

    async def connected(sessions: int) -> bool:
        return worker.state.connected and fake.sessions == sessions

    async with echo(echo_port), node(fake, node_port), anyio.create_task_group() as tg:
        await tg.start(worker.run)
        await wait_for(lambda: connected(1), timeout=10, what="the worker to connect")
        caplog.set_level(logging.INFO, logger="nvcf_mono.worker")
        leaving, fake.leaving = fake.leaving, anyio.Event()  # the next session stays
        leaving.set()
        await wait_for(lambda: connected(2), timeout=10, what="the worker to connect again")
        said = [r.getMessage() for r in caplog.records if "connection to the invocation plane lost" in r.getMessage()]
        assert said[-1].endswith(f"({NODE_STOPPING}); retrying in 0.1s"), said  # not 1.6 s, as after a failure
        worker.request_drain()
        fake.going.set()


async def _false(value: bool) -> bool:
    return not value


# ---- a fault of the worker's own -----------------------------------------------------------------------


class ServingNode(FakeNode):
    """A node that hands the worker the given requests and collects the frames it answers with."""

    def __init__(self, requests: list[Request]) -> None:
        super().__init__(refuse=0)
        self.requests = requests
        self.frames: dict[str, list[Frame]] = {}
        self.answered = anyio.Event()

    async def serve(self, stream: Stream[WorkerEnvelope, NodeEnvelope]) -> None:
        hello = await stream.recv_message()
        assert hello is not None and hello.kind == "hello"
        self.sessions += 1
        for request in self.requests:
            await stream.send_message(NodeEnvelope(request=request.encode(), attempt=1))
        async for message in stream:
            if message.frame is not None:
                frame = Frame.decode(message.frame)
                self.frames.setdefault(frame.request_id, []).append(frame)
                if all(any(f.end for f in self.frames.get(r.request_id, ())) for r in self.requests):
                    self.answered.set()


def _request(request_id: str, path: str) -> Request:
    return Request(
        request_id=request_id,
        nca_id="nca",
        function_id="fid",
        function_version_id="fvid",
        method="POST",
        path=path,
        headers=(("Content-Type", "application/json"),),
        reply="r",
        time_ms=0,
        deadline_ms=0,
        poll_seconds=60,
        body=b'{"message": "still here"}',
    )


async def test_a_fault_of_the_workers_own_fails_its_request_not_the_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before, an unexpected exception while serving one request ended the worker's whole session: every
    # request it held went back to the queue and the faulty one failed only after three deliveries.
    real_call = agent_module.call

    def faulty(http: Any, config: WorkerConfig, request: Request, *args: Any, **kwargs: Any) -> Any:
        if request.path == "/boom":
            raise RuntimeError("a bug in the worker")
        return real_call(http, config, request, *args, **kwargs)

    monkeypatch.setattr(agent_module, "call", faulty)
    node_port, echo_port = spare_port(), spare_port()
    config = worker_config(tmp_path, node_port, echo_port)
    fake = ServingNode([_request("boom", "/boom"), _request("fine", "/echo")])
    async with echo(echo_port), node(fake, node_port), anyio.create_task_group() as tg:
        await tg.start(Worker(config).run)
        with anyio.fail_after(10):
            await fake.answered.wait()
        tg.cancel_scope.cancel()
    (failed,) = fake.frames["boom"]
    assert failed.status == 500 and failed.end
    assert (
        "the worker failed serving the request: RuntimeError: a bug in the worker" in json.loads(failed.body)["detail"]
    )
    served = fake.frames["fine"]
    assert served[0].status == 200
    assert json.loads(b"".join(f.body for f in served))["message"] == "still here"
    assert fake.sessions == 1  # the session went on
