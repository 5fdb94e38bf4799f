"""The host against a real nats-server: readiness, retries, failures, staged shutdown, front doors."""

from __future__ import annotations

import json
import logging
import os
import stat
from pathlib import Path

import aiohttp
import anyio
import nats
import pytest
from grpclib.client import Channel
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from nats.js.api import StorageType

from nvcf_mono.host import Host, HostFailed, HostSetupError
from nvcf_mono.lifecycle import PluginState
from nvcf_mono.proto.gen.grpc.health.v1 import HealthCheckRequest, HealthCheckResponseServingStatus, HealthStub
from nvcf_mono.state_dir import StateDirBusy
from nvcf_mono.testing.host import config_for_test, running_host
from nvcf_mono.testing.nats_server import NatsServer
from tests.support import plugins

RECORDER = "tests.support.plugins:Recorder"


@pytest.fixture(autouse=True)
def _reset_plugins() -> None:
    plugins.EVENTS.clear()
    plugins.Flaky.attempts = 0


def _config(tmp_path: Path, nats: NatsServer, *refs: str, **settings: str):  # type: ignore[no-untyped-def]
    enabled = {f"plugins.{getattr(plugins, ref.rsplit(':', 1)[1]).spec.name}.enabled": "true" for ref in refs}
    return config_for_test(tmp_path / "state", nats_url=nats.url, extra_plugins=refs, settings={**enabled, **settings})


async def test_ready_host_serves_health_readiness_metrics_and_plugin_routes(
    tmp_path: Path, nats_server: NatsServer
) -> None:
    config = _config(tmp_path, nats_server, RECORDER)
    async with running_host(config) as host, aiohttp.ClientSession() as http:
        base = host.endpoints.url
        with anyio.fail_after(10):
            async with http.get(f"{base}/health") as resp:
                assert resp.status == 200
                assert await resp.json() == {"status": "OK"}
            async with http.get(f"{base}/ready") as resp:
                assert resp.status == 200
                body = await resp.json()
                assert body["status"] == "ready"
                assert body["bus"] == "connected"
                assert set(body["plugins"]) == set(config.order)
                assert {"control", "invocation", "compute", "recorder"} <= set(body["plugins"])
                assert all(p["state"] == "running" for p in body["plugins"].values())
            async with http.get(f"{base}/recorder") as resp:
                assert resp.status == 200
                assert await resp.json() == {"hello": "recorder"}
                length = resp.headers["Content-Length"]
            async with http.head(f"{base}/recorder") as resp:  # every GET answers HEAD: its head, no body
                assert resp.status == 200 and resp.headers["Content-Length"] == length
                assert resp.content_type == "application/json" and await resp.read() == b""
            async with http.head(f"{base}/metrics") as resp:
                assert resp.status == 200
            async with http.get(f"{base}/metrics") as resp:
                text = await resp.text()
                assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
                assert 'plugin_up{plugin="recorder"} 1' in text
                assert "host_ready 1" in text
                assert "nats_connected 1" in text
                assert 'http_requests_total{method="GET",route="/recorder",status="200"} 1' in text
            # Streams and buckets a plugin declared exist before it runs (it published at start).
            state = await host.bus.stream("RECORDER").info()
            assert state.messages == 1
            assert await host.bus.kv("recorder").get("missing") is None


async def test_errors_are_problem_json_and_hide_internals(tmp_path: Path, nats_server: NatsServer) -> None:
    async with running_host(_config(tmp_path, nats_server, RECORDER)) as host, aiohttp.ClientSession() as http:
        base = host.endpoints.url
        with anyio.fail_after(10):
            async with http.get(f"{base}/no/such/path") as resp:
                assert resp.status == 404
                assert resp.content_type == "application/problem+json"
                doc = await resp.json()
                assert doc == {
                    "type": "urn:nv-boot:problem-details:not-found",
                    "title": "Not Found",
                    "status": 404,
                    "detail": "no route for GET /no/such/path",
                    "instance": "/no/such/path",
                }
            async with http.post(f"{base}/recorder") as resp:
                assert resp.status == 405
                assert resp.headers["Allow"] == "GET,HEAD"
                assert (await resp.json())["detail"] == "method POST is not allowed on /recorder"
            async with http.get(f"{base}/recorder/crash") as resp:
                assert resp.status == 500
                body = await resp.text()
                assert "secret internal detail" not in body
                assert "Traceback" not in body
                assert json.loads(body)["detail"] == "internal error; the server log has the details"


async def test_grpc_health_reports_host_and_plugins(tmp_path: Path, nats_server: NatsServer) -> None:
    async with running_host(_config(tmp_path, nats_server, RECORDER)) as host:
        address, port = host.endpoints.grpc_address.rsplit(":", 1)
        channel = Channel(address, int(port))
        try:
            stub = HealthStub(channel)
            with anyio.fail_after(10):
                overall = await stub.check(HealthCheckRequest(service=""))
                assert overall.status == HealthCheckResponseServingStatus.SERVING
                plugin = await stub.check(HealthCheckRequest(service="recorder"))
                assert plugin.status == HealthCheckResponseServingStatus.SERVING
                with pytest.raises(GRPCError) as err:
                    await stub.check(HealthCheckRequest(service="nope"))
                assert err.value.status == Status.NOT_FOUND
        finally:
            channel.close()


async def test_plugin_not_ready_twice_is_retried_then_started(
    tmp_path: Path, nats_server: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    config = _config(tmp_path, nats_server, "tests.support.plugins:Flaky")
    async with running_host(config) as host, aiohttp.ClientSession() as http:
        assert plugins.Flaky.attempts == 3
        assert host.plugin_state("flaky") is PluginState.RUNNING
        with anyio.fail_after(10):
            async with http.get(f"{host.endpoints.url}/flaky") as resp:
                assert resp.status == 200
    retries = [r for r in caplog.records if r.name == "nvcf_mono.plugin.flaky" and "not ready" in r.getMessage()]
    assert len(retries) == 2
    assert "dependency missing (attempt 1)" in retries[0].getMessage()


async def test_routes_answer_503_while_their_plugin_is_retrying(tmp_path: Path, nats_server: NatsServer) -> None:
    config = _config(tmp_path, nats_server, "tests.support.plugins:Flaky", **{"plugins.flaky.failures": "1000"})
    host = Host(config)
    async with anyio.create_task_group() as tg, aiohttp.ClientSession() as http:
        tg.start_soon(host.serve)
        with anyio.fail_after(10):
            while host.plugin_state("flaky") is not PluginState.RETRYING:
                await anyio.sleep(0.02)
            base = host.endpoints.url
            async with http.get(f"{base}/flaky") as resp:
                assert resp.status == 503
                assert resp.headers["Retry-After"] == "1"
                assert "not running yet" in (await resp.json())["detail"]
            async with http.get(f"{base}/ready") as resp:
                assert resp.status == 503
                body = await resp.json()
                assert body["status"] == "starting"
                assert body["plugins"]["flaky"]["state"] == "retrying"
                assert "dependency missing" in body["plugins"]["flaky"]["reason"]
            async with http.get(f"{base}/health") as resp:
                assert resp.status == 200  # alive, just not ready
        # Shutting down while a plugin is still being retried ends the start-up quietly.
        host.request_shutdown()


async def test_plugin_still_not_ready_after_the_startup_timeout_stops_the_host(
    tmp_path: Path, nats_server: NatsServer
) -> None:
    config = _config(
        tmp_path,
        nats_server,
        "tests.support.plugins:Flaky",
        **{"plugins.flaky.failures": "1000", "startup.timeout": "0.5"},
    )
    with anyio.fail_after(15), pytest.raises(HostFailed, match=r"still not ready after 0\.5s"):
        await Host(config).serve()


async def test_plugin_raising_after_start_brings_the_host_down(
    tmp_path: Path, nats_server: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    config = _config(tmp_path, nats_server, RECORDER, "tests.support.plugins:Boom")
    host = Host(config)
    with anyio.fail_after(15), pytest.raises(HostFailed, match="boom: the plugin broke"):
        await host.serve()
    assert any(r.name == "nvcf_mono.plugin.boom" and r.exc_info for r in caplog.records)
    assert "recorder:stop" in plugins.EVENTS  # the others were stopped, not abandoned


async def test_run_returning_without_started_is_a_failure(tmp_path: Path, nats_server: NatsServer) -> None:
    config = _config(tmp_path, nats_server, "tests.support.plugins:NeverStarts")
    with anyio.fail_after(15), pytest.raises(HostFailed, match=r"without calling task_status\.started"):
        await Host(config).serve()


async def test_a_declaration_that_conflicts_with_the_server_stops_the_host_at_once(tmp_path: Path) -> None:
    """Declarations run concurrently; one that cannot be applied is fatal, named, and not retried."""
    server = NatsServer().start()
    try:
        with anyio.fail_after(5):
            nc = await nats.connect(server.url)
            try:  # the recorder's stream, already there in memory (the plugin declares it on file)
                js = nc.jetstream()
                await js.add_stream(name="RECORDER", subjects=["recorder.>"], storage=StorageType.MEMORY)
            finally:
                await nc.close()
        config = _config(tmp_path, server, RECORDER)
        # Within half the startup timeout (20 s): a host retrying the declaration would still be at it.
        with anyio.fail_after(10), pytest.raises(HostFailed, match=r"stream RECORDER exists with a different storage"):
            await Host(config).serve()
    finally:
        server.close()


def test_plugin_config_error_in_setup_fails_before_any_io(tmp_path: Path) -> None:
    config = config_for_test(
        tmp_path / "state",
        nats_url="nats://127.0.0.1:1",
        extra_plugins=["tests.support.plugins:BadSetup"],
        settings={"plugins.bad_setup.enabled": "true"},
    )
    with pytest.raises(HostSetupError) as err:
        Host(config)
    assert err.value.problems == ("plugins.bad_setup: needs a kubeconfig",)
    assert not (tmp_path / "state").exists()


async def test_plugins_stop_in_reverse_order_after_in_flight_requests_drain(
    tmp_path: Path, nats_server: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="nvcf_mono.host")
    config = _config(tmp_path, nats_server, RECORDER, "tests.support.plugins:After")
    async with aiohttp.ClientSession() as http:
        async with running_host(config) as host:
            assert plugins.EVENTS.index("recorder:start") < plugins.EVENTS.index("after:start")
            base = host.endpoints.url
            results: list[int] = []

            async def slow() -> None:
                async with http.get(f"{base}/recorder/slow?seconds=0.5") as resp:
                    results.append(resp.status)

            async with anyio.create_task_group() as tg:
                tg.start_soon(slow)
                with anyio.fail_after(5):
                    while "recorder:slow:begin" not in plugins.EVENTS:
                        await anyio.sleep(0.01)
                host.request_shutdown()
                with anyio.fail_after(5):
                    while not host.stopping:
                        await anyio.sleep(0.01)
                # No new connections once draining has begun.
                with pytest.raises(aiohttp.ClientConnectionError):
                    async with aiohttp.ClientSession() as fresh, fresh.get(f"{base}/health"):
                        pass
        assert results == [200]
    # The drain says what it waits for.
    # (the compute plugin's stop, its instances, is the plugin job)
    assert "for what is in flight: 1 HTTP request, 1 plugin job\n" in caplog.text
    events = plugins.EVENTS
    assert events.index("recorder:slow:end") < events.index("after:stop") < events.index("recorder:stop")
    assert "recorder:stopping" in events


async def test_a_plugins_stop_work_is_waited_for_when_nothing_else_is_in_flight(
    tmp_path: Path, nats_server: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    """The drain once ended without yielding when nothing was in flight, and the plugin was cancelled
    before its stop work began: a split deployment's compute node left its instances running."""
    caplog.set_level(logging.INFO, logger="nvcf_mono.host")
    async with running_host(_config(tmp_path, nats_server, "tests.support.plugins:StopWork")) as host:
        host.request_shutdown()
    assert plugins.EVENTS == ["stop_work:begin", "stop_work:done"]
    assert "for what is in flight: 2 plugin jobs\n" in caplog.text  # its and the compute plugin's


async def test_the_llm_gateways_readiness_probe_fails_as_soon_as_the_drain_begins(
    tmp_path: Path, nats_server: NatsServer
) -> None:
    """It answered 200 through a drain, so a balancer probing it kept sending calls to a stopping node."""
    config = _config(tmp_path, nats_server, "tests.support.plugins:StopWork")  # holds the drain for 0.5 s
    async with running_host(config) as host, aiohttp.ClientSession() as http:
        base = host.endpoints.url
        with anyio.fail_after(10):
            for probe, status in (("ready", "ready"), ("live", "live")):
                async with http.get(f"{base}/v1/health/{probe}") as resp:
                    assert resp.status == 200 and (await resp.json())["status"] == status
            host.request_shutdown()
            while "stop_work:begin" not in plugins.EVENTS:
                await anyio.sleep(0.01)
            async with http.get(f"{base}/v1/health/ready") as resp:
                doc = await resp.json()
                assert resp.status == 503 and resp.headers["Retry-After"] == "1", doc
                assert "this node is stopping" in doc["error"]["message"]
            async with http.get(f"{base}/v1/health/live") as resp:
                assert resp.status == 200  # alive: a liveness probe must not restart a draining node
    assert plugins.EVENTS == ["stop_work:begin", "stop_work:done"]


async def test_endpoints_file_is_private_and_complete(tmp_path: Path, nats_server: NatsServer) -> None:
    async with running_host(_config(tmp_path, nats_server)) as host:
        path = tmp_path / "state" / "endpoints.json"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        doc = json.loads(path.read_text())
        assert doc["version"] == 1
        assert doc["api_url"] == host.endpoints.url
        assert doc["invocation_url"] == host.endpoints.invocation_url
        assert doc["grpc_url"] == host.endpoints.grpc_address
        assert doc["nats_url"] == nats_server.url
        creds = doc["credentials"]
        assert set(creds) == {"admin_token", "api_key", "task_api_key"}
        assert creds["admin_token"].startswith("nvcf-admin-")
        assert creds["api_key"].startswith("nvapi-") and creds["task_api_key"].startswith("nvapi-")
        host.set_credential("admin_token", "t0ken")
        assert json.loads(path.read_text())["credentials"]["admin_token"] == "t0ken"
        assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]


async def test_a_second_host_on_the_same_state_dir_is_refused(tmp_path: Path, nats_server: NatsServer) -> None:
    async with running_host(_config(tmp_path, nats_server)):
        with (
            anyio.fail_after(10),
            pytest.raises(StateDirBusy, match=f"in use by another nvcf-mono \\(pid {os.getpid()}"),
        ):
            await Host(_config(tmp_path, nats_server)).serve()


async def test_unreachable_bus_fails_with_a_clear_error(tmp_path: Path) -> None:
    config = config_for_test(
        tmp_path / "state", nats_url="nats://127.0.0.1:1", settings={"bus.connect_retry_for": "0.5"}
    )
    with anyio.fail_after(10), pytest.raises(HostFailed, match=r"could not connect to NATS at nats://127\.0\.0\.1:1"):
        await Host(config).serve()
