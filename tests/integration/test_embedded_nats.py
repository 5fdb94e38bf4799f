"""The embedded nats-server under a host: persistence, crash recovery, orphan reaping."""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import aiohttp
import anyio
import pytest

from nvcf_mono.bus.api import BucketSpec, StreamSpec
from nvcf_mono.bus.embedded import find_nats_server
from nvcf_mono.host import Host
from nvcf_mono.testing.host import config_for_test, running_host
from tests.support.procs import live_processes
from tests.support.sockets import LISTEN, tcp_sockets


def _pids_on(store: Path) -> list[int]:
    """nats-server processes started with this state directory's config."""
    marker = str(store).encode()
    return [p.pid for p in live_processes() if b"nats-server" in (cmd := p.cmdline()) and marker in cmd]


@pytest.mark.slow
async def test_state_survives_a_restart_of_the_host(tmp_path: Path) -> None:
    state = tmp_path / "state"
    async with running_host(config_for_test(state)) as host:
        assert host.embedded is not None
        await host.bus.ensure_stream(StreamSpec(name="KEEP", subjects=("keep.>",)))
        await host.bus.stream("KEEP").publish("keep.one", b"payload")
        kv = await host.bus.ensure_bucket(BucketSpec(name="keep"))
        await kv.put("answer", b"42")
    assert _pids_on(state.resolve()) == []  # stopped with the host

    async with running_host(config_for_test(state)) as host:
        stored = await host.bus.stream("KEEP").get_last("keep.one")
        assert stored is not None and stored.data == b"payload"
        entry = await host.bus.kv("keep").get("answer")
        assert entry is not None and entry.value == b"42"


@pytest.mark.slow
async def test_a_crashed_server_is_restarted_and_clients_reconnect(tmp_path: Path) -> None:
    config = config_for_test(tmp_path / "state", settings={"embedded_nats.restart_backoff": "0.05"})
    async with running_host(config) as host:
        assert host.embedded is not None
        bus = host.bus
        await bus.ensure_stream(StreamSpec(name="CRASH", subjects=("crash.>",)))
        await bus.stream("CRASH").publish("crash.before", b"1")
        first = host.embedded.pid
        assert first is not None
        async with bus.events() as events, aiohttp.ClientSession() as http:
            os.kill(first, signal.SIGKILL)
            seen: set[str] = set()
            with anyio.fail_after(10):
                while len(seen) < 2:  # readiness follows the connection, and says why it is not ready
                    async with http.get(f"{host.endpoints.url}/ready") as resp:
                        if resp.status == 503:
                            assert (await resp.json())["status"] == "reconnecting"
                            seen.add("host")
                    async with http.get(f"{host.endpoints.url}/v1/health/ready") as resp:  # the LLM gateway's
                        if resp.status == 503:
                            message = (await resp.json())["error"]["message"]
                            assert "bus connection is reconnecting" in message, message
                            seen.add("gateway")
                    await anyio.sleep(0.01)
            with anyio.fail_after(15):
                kinds = []
                async for event in events:
                    kinds.append(event.kind)
                    if event.kind == "reconnected":
                        break
            assert "disconnected" in kinds
        assert host.embedded.pid not in (None, first)
        with anyio.fail_after(10):
            ack = await bus.stream("CRASH").publish("crash.after", b"2")
        assert ack.seq == 2  # the store survived the crash
        assert host.metrics.counter("embedded_nats_restarts_total", "").value() == 1
        assert host.ready
        async with aiohttp.ClientSession() as http, http.get(f"{host.endpoints.url}/v1/health/ready") as resp:
            assert resp.status == 200


@pytest.mark.slow
async def test_an_orphaned_server_on_the_store_is_reaped_not_duplicated(tmp_path: Path) -> None:
    state = tmp_path / "state"
    async with running_host(config_for_test(state)):
        pass
    conf = state.resolve() / "nats" / "nats-server.conf"
    # A server left behind by a host that died without its parent-death signal (e.g. not on Linux):
    # started through a shell that exits at once, so it is nobody's child here, like a real orphan.
    pidfile = conf.with_name("nats-server.pid")
    pidfile.unlink(missing_ok=True)
    subprocess.run(["sh", "-c", f"'{find_nats_server(None)}' -c '{conf}' >/dev/null 2>&1 &"], check=True)
    deadline = time.monotonic() + 10
    while not (pidfile.exists() and pidfile.read_text().strip()):
        assert time.monotonic() < deadline, "the orphan never wrote its pidfile"
        await anyio.sleep(0.02)
    orphan = int(pidfile.read_text())
    try:
        async with running_host(config_for_test(state)) as host:
            assert orphan not in _pids_on(state.resolve()), "the orphan is still running"
            assert host.embedded is not None
            assert _pids_on(state.resolve()) == [host.embedded.pid]
    finally:
        if orphan in _pids_on(state.resolve()):
            os.kill(orphan, signal.SIGKILL)


def _listening_ports(pid: int) -> set[int]:
    """TCP ports process ``pid`` listens on."""
    return {sock.local_port for sock in tcp_sockets(pid) if sock.state == LISTEN}


def _client_port(host: Host) -> int:
    return int(host.endpoints.nats_url.rsplit(":", 1)[1])


def _monitoring_lines(conf: Path) -> list[str]:
    return [
        line for line in conf.read_text().splitlines() if re.match(r"\s*(https?|http_port|https_port)\s*[:=]", line)
    ]


@pytest.mark.slow
async def test_no_monitoring_endpoint_by_default_even_after_a_crash(tmp_path: Path) -> None:
    """The monitoring port lists every user and subscription without a login: it is not opened."""
    state = tmp_path / "state"
    config = config_for_test(state, settings={"embedded_nats.restart_backoff": "0.05"})
    async with running_host(config) as host:
        assert host.embedded is not None
        assert _monitoring_lines(host.embedded.config_path) == []
        first = host.embedded.pid
        assert first is not None
        assert _listening_ports(first) == {_client_port(host)}  # the client port, nothing else

        # Readiness without it, on the restart-after-crash path too.
        os.kill(first, signal.SIGKILL)
        with anyio.fail_after(20):
            while host.embedded.pid in (None, first) or host.metrics.gauge("embedded_nats_up", "").value() != 1:
                await anyio.sleep(0.02)
        second = host.embedded.pid
        assert second is not None
        assert _listening_ports(second) == {_client_port(host)}
        await host.bus.ensure_stream(StreamSpec(name="AFTER", subjects=("after.>",)))
        with anyio.fail_after(10):
            assert (await host.bus.stream("AFTER").publish("after.one", b"1")).seq == 1


async def test_monitoring_when_asked_is_on_loopback_and_says_it_is_unauthenticated(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = config_for_test(tmp_path / "state", settings={"embedded_nats.monitor_port": "0"})
    with caplog.at_level(logging.WARNING, logger="nvcf_mono"):
        async with running_host(config) as host:
            assert host.embedded is not None and host.embedded.pid is not None
            (line,) = _monitoring_lines(host.embedded.config_path)
            port = int(line.split(":")[-1].strip().strip('"'))
            assert '"127.0.0.1:' in line
            assert _listening_ports(host.embedded.pid) == {_client_port(host), port}
            async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/varz") as resp:
                assert resp.status == 200
    assert any("no authentication" in r.getMessage() and str(port) in r.getMessage() for r in caplog.records)


def _environment(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.decode().split("=", 1) for item in raw.split(b"\0") if b"=" in item)


@pytest.mark.parametrize(("setting", "expected"), [(None, "1"), ("3", "3"), ("null", None)])
async def test_the_servers_go_runtime_gets_the_cores_it_is_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, setting: str | None, expected: str | None
) -> None:
    """One core by default (GOMAXPROCS=1); null: what the host's environment says (here: the Go default)."""
    monkeypatch.delenv("GOMAXPROCS", raising=False)
    settings = {} if setting is None else {"embedded_nats.gomaxprocs": setting}
    async with running_host(config_for_test(tmp_path / "state", settings=settings)) as host:
        assert host.embedded is not None and host.embedded.pid is not None
        assert _environment(host.embedded.pid).get("GOMAXPROCS") == expected
