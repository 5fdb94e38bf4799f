"""The worker's health port (real sockets on 127.0.0.1), its checks of the inference server, and its
start: the worker process does not import aiohttp.
"""

from __future__ import annotations

import errno
import json
import subprocess
import sys

import aiohttp
import anyio
import attrs
import pytest
from aiohttp import web
from anyio.abc import SocketStream

from nvcf_mono.worker import health
from nvcf_mono.worker.agent import WorkerState
from nvcf_mono.worker.health import serve_health
from nvcf_mono.worker.inference import check_health, health_client
from tests.unit.worker.servers import aiohttp_server
from tests.unit.worker.test_inference import config


async def raw(port: int, data: bytes) -> bytes:
    """What the server answers to ``data`` (then the end of what is sent) before it closes the connection."""
    with anyio.fail_after(5):
        async with await anyio.connect_tcp("127.0.0.1", port) as stream:
            await stream.send(data)
            await stream.send_eof()
            answer = b""
            try:
                while True:
                    answer += await stream.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionResetError):
                return answer


async def test_the_health_port_answers_probes_and_scrapes_from_the_workers_state() -> None:
    state = WorkerState()
    async with anyio.create_task_group() as tg, aiohttp.ClientSession() as session:
        port = await tg.start(serve_health, state, 0)
        base = f"http://127.0.0.1:{port}"
        async with session.get(f"{base}/v1/health/live") as resp:
            assert (resp.status, await resp.json()) == (200, {"status": "live"})
        async with session.get(f"{base}/v1/health/ready") as resp:
            body = await resp.json()
            assert resp.status == 503 and body["status"] == "not ready", body
            assert body["detail"] == "waiting for the inference server", body
        state.inference_healthy = state.connected = True
        state.inference_detail = ""
        state.in_flight = 2
        async with session.get(f"{base}/v1/health/ready?verbose=1") as resp:  # a query changes nothing
            body = await resp.json()
            assert resp.status == 200 and body["status"] == "ready" and body["inFlight"] == 2, body
            assert "detail" not in body, body
        async with session.get(f"{base}/metrics") as resp:
            assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/plain"), resp.headers
            text = await resp.text()
            assert "# TYPE worker_thread_busy_seconds counter" in text, text
            assert "nvcf_worker_requests_in_flight 2" in text and "nvcf_worker_connected 1" in text, text
        async with session.head(f"{base}/v1/health/live") as resp:
            assert resp.status == 200 and await resp.read() == b""
        tg.cancel_scope.cancel()


async def test_the_health_port_refuses_what_it_does_not_serve_and_keeps_serving() -> None:
    async with anyio.create_task_group() as tg, aiohttp.ClientSession() as session:
        port = await tg.start(serve_health, WorkerState(), 0)
        base = f"http://127.0.0.1:{port}"
        async with session.get(f"{base}/v1/health/nope") as resp:
            assert resp.status == 404 and resp.content_type == "application/problem+json"
            doc = await resp.json(content_type=None)
            assert doc["status"] == 404 and "/v1/health/ready" in doc["detail"], doc
        async with session.post(f"{base}/v1/health/live", data=b"x") as resp:
            assert resp.status == 405 and resp.headers["Allow"] == "GET, HEAD"
            assert "not POST" in (await resp.json(content_type=None))["detail"]
        # Not HTTP, a head larger than the limit, a client that hangs up: answered or dropped, never fatal.
        assert (await raw(port, b"hello\r\n\r\n")).startswith(b"HTTP/1.1 400 Bad Request\r\n")
        assert await raw(port, b"GET /metrics HTTP/1.1\r\nX: " + b"a" * (4 * health.MAX_HEAD)) == b""
        assert await raw(port, b"GET /v1/hea") == b""  # and hangs up
        async with session.get(f"{base}/v1/health/live") as resp:
            assert resp.status == 200
        tg.cancel_scope.cancel()


async def test_a_client_that_sends_nothing_is_let_go(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(health, "CLIENT_TIMEOUT", 0.2)
    async with anyio.create_task_group() as tg:
        port = await tg.start(serve_health, WorkerState(), 0)
        with anyio.fail_after(5):
            async with await anyio.connect_tcp("127.0.0.1", port) as stream:
                with pytest.raises((anyio.EndOfStream, ConnectionResetError)):
                    await stream.receive()  # closed by the server, not by this deadline
        tg.cancel_scope.cancel()


async def test_health_checks_tell_healthy_wrong_status_unreachable_and_silent_apart() -> None:
    routes = web.RouteTableDef()
    answers = {"status": 200}
    done = anyio.Event()

    @routes.get("/v2/health/ready")
    async def ready(_: web.Request) -> web.Response:
        return web.Response(status=answers["status"], body=b"x" * 200_000)  # read whole, the connection reused

    @routes.get("/slow")
    async def slow(_: web.Request) -> web.Response:
        with anyio.move_on_after(10):
            await done.wait()
        return web.Response()

    async with aiohttp_server(routes) as port:
        cfg = config(port)
        async with health_client(cfg) as client:
            assert await check_health(client, cfg) == (True, "")
            assert await check_health(client, cfg) == (True, "")
            answers["status"] = 503
            healthy, why = await check_health(client, cfg)
            assert not healthy and "answered 503, expected 200" in why, why
            slow_cfg = attrs.evolve(cfg, health_endpoint="/slow", health_timeout=0.3)
            healthy, why = await check_health(client, slow_cfg)
            assert not healthy and "no answer within 0.3s" in why, why
            done.set()
    async with health_client(cfg) as client:  # the server is gone
        healthy, why = await check_health(client, cfg)
        assert not healthy and "Unreachable" in why, why


def test_the_worker_process_does_not_import_aiohttp_or_yaml() -> None:
    """aiohttp's import was a third of the worker's start, YAML's and the bus's declarations another 10 ms
    each, and the worker's start is on every cold start's path. Reading its settings from the environment
    does not need YAML either.
    """
    code = (
        "import json, sys, nvcf_mono.worker.main\n"
        "from nvcf_mono.worker.config import WorkerConfig\n"
        "WorkerConfig.from_env({'NVCF_WORKER_TOKEN': 't', 'NVCF_FQDN_GRPC': '127.0.0.1:1', 'FUNCTION_ID': 'f',"
        " 'FUNCTION_VERSION_ID': 'v', 'NCA_ID': 'n', 'INSTANCE_ID': 'i', 'MAX_REQUEST_CONCURRENCY': '4',"
        " 'INFERENCE_HEALTH_TIMEOUT': '3', 'WORKER_HEALTH_INTERVAL': '0.5'})\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('aiohttp', 'yaml')"
        " or m == 'nvcf_mono.bus.api')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [], out.stdout


async def test_a_route_that_fails_is_a_500_and_the_port_keeps_serving(monkeypatch: pytest.MonkeyPatch) -> None:
    state = WorkerState()
    async with anyio.create_task_group() as tg, aiohttp.ClientSession() as session:
        port = await tg.start(serve_health, state, 0)

        def broken() -> float:
            raise RuntimeError("boom")

        monkeypatch.setattr(WorkerState, "busy_seconds", property(lambda _: broken()))
        async with session.get(f"http://127.0.0.1:{port}/metrics") as resp:
            assert resp.status == 500 and "RuntimeError" in (await resp.json(content_type=None))["detail"]
        monkeypatch.undo()
        async with session.get(f"http://127.0.0.1:{port}/metrics") as resp:
            assert resp.status == 200
        tg.cancel_scope.cancel()


async def test_silent_connections_beyond_the_limit_wait_to_be_accepted_and_are_answered_in_turn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(health, "MAX_CLIENTS", 2)
    monkeypatch.setattr(health, "CLIENT_TIMEOUT", 0.5)
    async with anyio.create_task_group() as tg:
        port = await tg.start(serve_health, WorkerState(), 0)
        silent = [await anyio.connect_tcp("127.0.0.1", port) for _ in range(3)]  # two served, one waits
        with anyio.fail_after(5):
            answer = await raw(port, b"GET /v1/health/live HTTP/1.1\r\n\r\n")  # once the silent ones time out
        assert answer.startswith(b"HTTP/1.1 200 OK\r\n"), answer
        for stream in silent[:2]:  # answered only after the server let the first two go
            with anyio.fail_after(0.2), pytest.raises((anyio.EndOfStream, ConnectionResetError)):
                await stream.receive()
        for stream in silent:
            await stream.aclose()
        tg.cancel_scope.cancel()


async def test_health_checks_follow_redirects_on_the_server_only() -> None:
    routes = web.RouteTableDef()
    seen: list[str] = []

    @routes.get("/v2/health/ready")
    async def slash(_: web.Request) -> web.Response:
        raise web.HTTPTemporaryRedirect("ready/")  # a framework's trailing-slash redirect, relative

    @routes.get("/v2/health/ready/")
    async def ready(request: web.Request) -> web.Response:
        seen.append(request.path)
        return web.Response(text="ok")

    @routes.get("/loop")
    async def loop(_: web.Request) -> web.Response:
        raise web.HTTPFound("/loop")

    @routes.get("/away")
    async def away(_: web.Request) -> web.Response:
        raise web.HTTPFound("http://198.51.100.7/health")

    async with aiohttp_server(routes) as port:
        cfg = config(port)
        async with health_client(cfg) as client:
            assert await check_health(client, cfg) == (True, "")
            assert seen == ["/v2/health/ready/"]
            healthy, why = await check_health(client, attrs.evolve(cfg, health_endpoint="/loop"))
            assert not healthy and "answered 302, expected 200" in why, why
            healthy, why = await check_health(client, attrs.evolve(cfg, health_endpoint="/away"))
            assert not healthy and "redirects to another server" in why, why
            # A redirect that is the expected answer is not followed.
            assert await check_health(
                client, attrs.evolve(cfg, health_endpoint="/away", health_expected_status=302)
            ) == (
                True,
                "",
            )


async def test_the_port_outlives_a_failed_accept(monkeypatch: pytest.MonkeyPatch) -> None:
    """A failed accept (EMFILE: no file descriptor left) is logged and tried again; it does not end the worker."""
    from anyio._backends._asyncio import TCPSocketListener

    monkeypatch.setattr(health, "ACCEPT_PAUSE", 0.01)
    real = TCPSocketListener.accept
    failures = [3]

    async def accept(self: TCPSocketListener) -> SocketStream:
        if failures[0]:
            failures[0] -= 1
            raise OSError(errno.EMFILE, "Too many open files")
        return await real(self)

    monkeypatch.setattr(TCPSocketListener, "accept", accept)
    async with anyio.create_task_group() as tg:
        port = await tg.start(serve_health, WorkerState(), 0)
        with anyio.fail_after(5):
            assert (await raw(port, b"GET /v1/health/live HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 200 OK")
        assert failures == [0]
        tg.cancel_scope.cancel()
