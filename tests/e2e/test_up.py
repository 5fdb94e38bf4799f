"""``nvcf-mono up`` as a child process: ready, endpoints, signals, restarts on the same store."""

from __future__ import annotations

import json
import os
import resource
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.e2e.cli import ROOT, Platform, cli_env, fast_flags, get, nats_servers_on

pytestmark = pytest.mark.e2e


def _publish_and_store(nats_url: str, stream: str) -> None:
    """Write a stream message and a KV value through a separate client process."""
    script = f"""
import anyio, logging
from nvcf_mono.bus.nats import open_nats_bus
from nvcf_mono.bus.api import StreamSpec, BucketSpec
from nvcf_mono.config.model import BusSettings
from nvcf_mono.metrics import Metrics
async def main():
    async with open_nats_bus(BusSettings(), servers=[{nats_url!r}], name="t", metrics=Metrics(),
                             log=logging.getLogger("t")) as bus:
        await bus.ensure_stream(StreamSpec(name={stream!r}, subjects=("{stream.lower()}.>",)))
        await bus.stream({stream!r}).publish("{stream.lower()}.x", b"kept")
        kv = await bus.ensure_bucket(BucketSpec(name="{stream.lower()}"))
        await kv.put("k", b"v")
anyio.run(main)
"""
    subprocess.run([os.sys.executable, "-c", script], check=True, timeout=30, env=cli_env(), cwd=ROOT)


def _read_back(nats_url: str, stream: str) -> tuple[bytes, bytes]:
    script = f"""
import anyio, logging
from nvcf_mono.bus.nats import open_nats_bus
from nvcf_mono.config.model import BusSettings
from nvcf_mono.metrics import Metrics
async def main():
    async with open_nats_bus(BusSettings(), servers=[{nats_url!r}], name="t", metrics=Metrics(),
                             log=logging.getLogger("t")) as bus:
        msg = await bus.stream({stream!r}).get_last("{stream.lower()}.x")
        entry = await bus.kv("{stream.lower()}").get("k")
        print(msg.data.decode(), entry.value.decode())
anyio.run(main)
"""
    out = subprocess.run(
        [os.sys.executable, "-c", script],
        check=True,
        timeout=30,
        env=cli_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
    ).stdout.split()
    return out[0].encode(), out[1].encode()


def test_a_low_open_files_limit_is_raised_so_many_idle_connections_do_not_lock_everyone_out(tmp_path: Path) -> None:
    """Started with a soft limit of 256 open files, 400 idle connections used to leave no descriptor to
    accept the next client with: the platform raises its soft limit to the hard one.
    """
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1024:
        pytest.fail(f"this machine's hard open-files limit ({hard}) is too low for the test")
    state = tmp_path / "state"
    limited = ["sh", "-c", 'ulimit -S -n 256 && exec "$@"', "sh", sys.executable, "-m", "nvcf_mono"]
    platform = Platform(["up", *fast_flags(state)], state, command=[*limited, "up", *fast_flags(state)])
    idle: list[socket.socket] = []
    try:
        doc = platform.wait_ready()
        address = urllib.parse.urlsplit(doc["api_url"])
        for _ in range(400):
            idle.append(socket.create_connection((address.hostname, address.port), timeout=5))
        assert get(doc["api_url"] + "/health") == (200, b'{"status": "OK"}')  # a client that came later
        assert "Too many open files" not in platform.stderr()
    finally:
        for conn in idle:
            conn.close()
        platform.stop()


@pytest.mark.slow
def test_up_serves_writes_endpoints_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    state = tmp_path / "state"
    platform = Platform(["up", *fast_flags(state)], state)
    try:
        doc = platform.wait_ready()
        assert stat.S_IMODE(platform.endpoints_path.stat().st_mode) == 0o600
        assert set(doc) == {
            "version", "role", "node_url", "api_url", "invocation_url", "grpc_url", "grpc_tls", "ca_file", "nats_url",
            "credentials",
        }  # fmt: skip
        assert doc["grpc_tls"] is False and doc["ca_file"] is None  # plaintext on loopback by default
        assert get(doc["api_url"] + "/health") == (200, b'{"status": "OK"}')
        status, body = get(doc["api_url"] + "/ready")
        assert status == 200 and json.loads(body)["role"] == "all-in-one"
        assert "nvcf-mono is ready" in platform.stdout()
        assert doc["api_url"] in platform.stdout()
        # Where OpenAI's clients point: the banner says, and it answers there.
        assert f"LLM gateway {doc['node_url'].rstrip('/')}/v1 " in platform.stdout()
        assert get(doc["node_url"].rstrip("/") + "/v1/health/ready")[0] == 200
        servers = nats_servers_on(state)
        assert len(servers) == 1
        platform.signal(signal.SIGTERM)
        assert platform.wait(timeout=30) == 0
        assert nats_servers_on(state) == []
        assert "Traceback" not in platform.stderr()
    finally:
        platform.stop()


@pytest.mark.slow
def test_after_sigkill_a_restart_reuses_the_store_without_a_second_server(tmp_path: Path) -> None:
    state = tmp_path / "state"
    first = Platform(["up", *fast_flags(state)], state)
    try:
        doc = first.wait_ready()
        _publish_and_store(doc["nats_url"], "SURVIVE")
        first.signal(signal.SIGKILL)
        first.wait()
        # The server dies with its host (parent-death signal) rather than lingering as an orphan.
        deadline = time.monotonic() + 10
        while nats_servers_on(state):
            assert time.monotonic() < deadline, "nats-server outlived its SIGKILLed host"
            time.sleep(0.05)
    finally:
        first.stop()
    second = Platform(["up", *fast_flags(state)], state)
    try:
        doc = second.wait_ready()
        assert len(nats_servers_on(state)) == 1
        assert _read_back(doc["nats_url"], "SURVIVE") == (b"kept", b"v")
        # A third on the same state directory is an operator's mistake: one clear line, no traceback.
        third = Platform(["up", *fast_flags(state)], state)
        try:
            assert third.wait(timeout=30) == 1
            assert "is in use by another nvcf-mono" in third.stderr(), third.stderr()
            assert "Traceback" not in third.stderr(), third.stderr()
        finally:
            third.stop()
        second.signal(signal.SIGTERM)
        assert second.wait() == 0
        assert nats_servers_on(state) == []
    finally:
        second.stop()


@pytest.mark.slow
def test_a_second_sigterm_stops_without_waiting_for_the_drain(tmp_path: Path) -> None:
    state = tmp_path / "state"
    args = [
        "up",
        *fast_flags(state),
        "--set",
        "extra_plugins=[tests.support.plugins:Recorder]",
        "--set",
        "plugins.recorder.enabled=true",
        "--set",
        "shutdown.drain_grace=60",
    ]
    platform = Platform(args, state)
    try:
        doc = platform.wait_ready()
        slow = threading.Thread(target=get, args=(doc["api_url"] + "/recorder/slow?seconds=120", 130), daemon=True)
        slow.start()
        platform.wait_for_log("recorder: a slow request began")
        platform.signal(signal.SIGTERM)
        platform.wait_for_log("SIGTERM received: draining")
        assert platform.proc.poll() is None, "the first signal should drain, not exit"
        started = time.monotonic()
        platform.signal(signal.SIGTERM)
        platform.wait(timeout=20)
        assert time.monotonic() - started < 15
        assert nats_servers_on(state) == []
        assert "received again: stopping without waiting" in platform.stderr()
    finally:
        platform.stop()


@pytest.mark.slow
def test_make_up_starts_the_platform(tmp_path: Path) -> None:
    """The README's first command, through the Makefile, against this test run's virtualenv."""
    venv = Path(os.sys.prefix)
    state = tmp_path / "state"
    flags = " ".join(fast_flags(state))
    command = ["make", "--no-print-directory", "-C", str(ROOT), "up", f"VENV={venv}", f"ARGS={flags}"]
    for stamp in (".installed-runtime",):  # the venv the tests run in is already installed
        (venv / stamp).touch()
    platform = Platform([], state, command=command, new_session=True)
    try:
        doc = platform.wait_ready(timeout=120)
        assert get(doc["api_url"] + "/health")[0] == 200
        platform.signal_group(signal.SIGINT)  # Ctrl-C in the terminal running `make up`
        platform.wait(timeout=30)  # make reports the interrupt; what matters is how the platform stopped
        assert "SIGINT received: draining" in platform.stderr()
        assert "nvcf_mono.host: stopped" in platform.stderr()
        assert nats_servers_on(state) == []
    finally:
        platform.stop()


@pytest.mark.slow
def test_up_in_a_fresh_directory_serves_its_example_function(tmp_path: Path) -> None:
    """As a newcomer runs it: a relative state directory, the example deployed, invoked as the banner says."""
    platform = Platform(["up", *fast_flags(Path(".nvcf-mono"))], Path(".nvcf-mono"), cwd=tmp_path)
    try:
        doc = platform.wait_ready()
        marker = tmp_path / ".nvcf-mono" / "plugins" / "control" / "example-function.json"
        deadline = time.monotonic() + 60
        while not marker.exists() or "is ACTIVE" not in platform.stderr():  # the log says when
            assert time.monotonic() < deadline, platform.stderr()[-3000:]
            time.sleep(0.2)
        fid = json.loads(marker.read_text())["function_id"]
        assert f"nvcf-mono invoke {fid} -d" in platform.stdout()
        request = urllib.request.Request(
            f"{doc['invocation_url']}/v2/nvcf/pexec/functions/{fid}",
            data=b'{"message": "hello"}',
            headers={"Authorization": f"Bearer {doc['credentials']['api_key']}", "Content-Type": "application/json"},
        )
        for _ in range(50):  # the invocation node's view of the status follows the control plane's by a moment
            try:
                with urllib.request.urlopen(request, timeout=30) as reply:
                    assert reply.status == 200 and json.loads(reply.read())["message"] == "hello"
                    break
            except urllib.error.HTTPError as err:
                problem = err.read()
                # A DEPLOYING function queues the call; only a view that has not seen the deployment yet refuses.
                assert err.code == 404 and b"not deployed" in problem, problem
                time.sleep(0.1)
        else:
            raise AssertionError(f"the example never answered: {problem!r}")
        platform.signal(signal.SIGTERM)
        assert platform.wait(timeout=30) == 0
        assert "Traceback" not in platform.stderr()
        # A stop is not a fault: the agent's last heartbeats after the control plane stopped say nothing.
        assert "cannot reach the control plane" not in platform.stderr(), platform.stderr()[-3000:]
    finally:
        platform.stop()
