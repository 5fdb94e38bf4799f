"""Killing the control-plane process that holds the autoscaler's lease: another takes over, scaling goes on.

Four real processes on one external nats-server: two control planes (cp-a leads first), and one
invocation node with the compute plane (a local cluster). cp-a is killed with SIGKILL, so its lease
is not handed over: cp-b takes it when it expires, then scales the idle version to zero and wakes it
again on the next request.
"""

from __future__ import annotations

import json
import signal
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from nvcf_mono.auth.secret import PlatformSecret
from nvcf_mono.ports import spare_port
from nvcf_mono.testing.nats_server import NatsServer
from tests.integration.compute.conftest import cluster_pids

from .cli import Platform, get

T = TypeVar("T")

FAST = {
    "plugins.control.reconcile.interval": "0.5",
    "plugins.control.reconcile.lease_ttl": "3",
    "plugins.control.cluster_heartbeat_ttl": "5",
    "plugins.control.example_function": "false",
    "plugins.control.autoscaler.interval": "0.3",
    "plugins.control.autoscaler.sample_step": "0.5",
    "plugins.control.autoscaler.lookback": "2",
    "plugins.control.autoscaler.utilization_window": "1",
    # Long enough that a loaded machine still sees the first instance running before it is idle.
    "plugins.control.autoscaler.idle_timeout": "6",
    "plugins.control.autoscaler.worker_stale": "2",
    "plugins.invocation.load_report_interval": "0.2",
    "plugins.compute.heartbeat_interval": "0.5",
    "plugins.compute.local.termination_grace": "3",
    "images.echo.command": json.dumps(["{python}", "-m", "nvcf_mono.testing.echo_server", "--port", "{port}"]),
}


def flags(state: Path, nats: str, secret: Path, **more: str) -> list[str]:
    values = {
        "http.port": "0",
        "grpc.port": "0",
        "bus.url": nats,
        "plugins.auth.secret_file": str(secret),
        **FAST,
        **more,
    }
    out = ["--state-dir", str(state)]
    for key, value in values.items():
        out += ["--set", f"{key}={value}"]
    return out


def call(method: str, url: str, token: str, body: Any = None, timeout: float = 60) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        url, data=data, method=method, headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
            return resp.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")


def until(probe: Callable[[], T | None], timeout: float, what: str) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = probe()
        if found is not None and found is not False:
            return found
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def leader(api_url: str) -> bool:
    status, body = get(api_url + "/metrics")
    return status == 200 and "\nnvcf_control_leader 1" in body.decode()


@pytest.mark.slow
def test_a_new_leader_keeps_scaling_after_the_old_one_is_killed(tmp_path: Path) -> None:
    nats = NatsServer().start()
    secret = tmp_path / "secret"
    PlatformSecret.generate().write(secret)
    grpc_port = spare_port()
    worker_address = f"127.0.0.1:{grpc_port}"
    cluster_id = str(uuid.uuid4())
    cluster = [{"name": "local", "id": cluster_id, "gpu_discovery": "static", "gpus": [{"name": "H100", "count": 2}]}]
    procs: list[Platform] = []
    try:
        control = {"role": "control", "plugins.control.worker_grpc_address": worker_address}
        a = Platform(["up", *flags(tmp_path / "a", nats.url, secret, **control, **{"node.id": "cp-a"})], tmp_path / "a")
        procs.append(a)
        doc_a = a.wait_ready()
        until(lambda: leader(doc_a["api_url"]), 15, "cp-a to lead")
        b = Platform(["up", *flags(tmp_path / "b", nats.url, secret, **control, **{"node.id": "cp-b"})], tmp_path / "b")
        procs.append(b)
        doc_b = b.wait_ready()
        node = {
            "role": "invocation",
            "node.id": "inv",
            "grpc.port": str(grpc_port),
            "plugins.compute.enabled": "true",
            "plugins.compute.clusters": json.dumps(cluster),
        }
        c = Platform(["up", *flags(tmp_path / "c", nats.url, secret, **node)], tmp_path / "c")
        procs.append(c)
        doc_c = c.wait_ready()
        token = doc_a["credentials"]["admin_token"]
        api_a, invoke_url = doc_a["api_url"], doc_c["invocation_url"]

        def cluster_registered() -> bool:
            status, body = call("GET", f"{api_a}/v2/nvcf/clusterGroups", token)
            return status == 200 and "local" in json.dumps(body)

        until(cluster_registered, 20, "the cluster to register")
        status, body = call(
            "POST",
            f"{api_a}/v2/nvcf/functions",
            token,
            {
                "name": "echo",
                "inferenceUrl": "/echo",
                "inferencePort": 9000,
                "containerImage": "echo",
                "health": {
                    "protocol": "HTTP",
                    "uri": "/health",
                    "port": 9000,
                    "timeout": "PT5S",
                    "expectedStatusCode": 200,
                },
            },
        )
        assert status == 200, body
        fid, vid = body["function"]["id"], body["function"]["versionId"]
        dep = f"/v2/nvcf/deployments/functions/{fid}/versions/{vid}"
        spec = {"gpu": "H100", "instanceType": "ON-PREM.GPU.H100_1x", "minInstances": 0, "maxInstances": 2}
        status, body = call("POST", api_a + dep, token, {"deploymentSpecifications": [spec]})
        assert status == 200, body

        def placement(api: str) -> dict[str, Any] | None:
            status, body = call("GET", api + dep, token)
            if status != 200 or body["deployment"]["functionStatus"] != "ACTIVE":
                return None
            found: dict[str, Any] = body["deployment"]["deploymentSpecifications"][0]["placement"]
            return found

        until(lambda: placement(api_a), 20, "ACTIVE")
        status, body = call("POST", f"{invoke_url}/v2/nvcf/pexec/functions/{fid}", token, {"message": "one"})
        assert status == 200 and body["message"] == "one", body
        # At least one: on a slow machine the cold start's backlog can rightly ask for the second (max 2).
        running = until(lambda: (p := placement(api_a)) and p["runningInstances"] >= 1, 30, "a running instance")
        assert running

        a.signal(signal.SIGKILL)
        a.wait(timeout=10)
        until(lambda: leader(doc_b["api_url"]), 15, "cp-b to take the lease over")
        api_b = doc_b["api_url"]
        zero = until(
            lambda: (p := placement(api_b)) and p["placedInstances"] == 0 and p,
            30,
            "cp-b to scale the idle version to zero",
        )
        assert "scale to zero" in zero["autoscaler"]
        status, body = call("POST", f"{invoke_url}/v2/nvcf/pexec/functions/{fid}", token, {"message": "two"})
        assert status == 200 and body["message"] == "two", body
        # Remove it before stopping: the local backend leaves instances running for the next agent.
        status, body = call("DELETE", api_b + dep, token)
        assert status == 200, body
        until(lambda: cluster_pids(cluster_id) == [], 30, "the instance processes to end")
        for proc in (b, c):
            proc.signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0, proc.stderr()[-3000:]
            assert "Traceback" not in proc.stderr()
    finally:
        for proc in procs:
            proc.stop()
        nats.close()
