"""The embedded nats-server under a host: persistence, crash recovery, orphan reaping."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import aiohttp
import anyio
import pytest

from nvcf_mono.bus.api import BucketSpec, StreamSpec
from nvcf_mono.bus.embedded import find_nats_server
from nvcf_mono.testing.host import config_for_test, running_host

pytestmark = pytest.mark.nats


def _pids_on(store: Path) -> list[int]:
    """nats-server processes started with this state directory's config."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if "nats-server" in cmd and str(store) in cmd:
            found.append(int(entry.name))
    return found


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
            with anyio.fail_after(10):
                while True:  # readiness follows the connection, and says why it is not ready
                    async with http.get(f"{host.endpoints.api_url}/ready") as resp:
                        if resp.status == 503:
                            assert (await resp.json())["status"] == "reconnecting"
                            break
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
