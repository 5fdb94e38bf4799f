"""``nvcf-mono up-split`` (``make up-split``): three roles and a NATS as processes of their own on one machine.

The shipped ``config/split`` files are used with only their ports moved to free ones, so the
README's one-machine commands are what runs here. The CLI is pointed at the control node's state
directory only, and each command must reach the node that serves it.
"""

from __future__ import annotations

import json
import signal
import socket
import time
import urllib.request
from pathlib import Path
from typing import Any
from unittest.mock import ANY

import openai
import pytest
import yaml

from tests.e2e.cli import ROOT, Platform, cli_env, get, nats_servers_on, run_cli
from tests.support.leftovers import processes_under

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _free_ports(count: int) -> list[int]:
    socks = [socket.socket() for _ in range(count)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def _configs(into: Path, control: int, invocation: int, invocation_grpc: int, compute: int) -> None:
    """The shipped files with their ports moved (and nothing else changed)."""
    into.mkdir()
    docs = {role: yaml.safe_load((ROOT / "config" / "split" / f"{role}.yaml").read_text()) for role in
            ("control", "invocation", "compute")}  # fmt: skip
    docs["control"]["http"]["port"] = control
    docs["control"]["peers"] = {
        "invocation_url": f"http://127.0.0.1:{invocation}",
        "invocation_grpc_address": f"127.0.0.1:{invocation_grpc}",
    }
    docs["invocation"]["http"]["port"] = invocation
    docs["invocation"]["grpc"]["port"] = invocation_grpc
    docs["invocation"]["peers"] = {"api_url": f"http://127.0.0.1:{control}"}
    docs["compute"]["http"]["port"] = compute
    for role, doc in docs.items():
        (into / f"{role}.yaml").write_text(yaml.safe_dump(doc))


def _post(url: str, body: bytes, token: str | None = None) -> tuple[int, dict[str, Any]]:
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {token}"} if token else {})
    req = urllib.request.Request(url, data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def _wait_for(platform: Platform, text: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while text not in platform.stdout():
        if platform.proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"up-split never said {text!r}:\n{platform.stderr()[-4000:]}")
        time.sleep(0.1)


def test_up_split_routes_each_command_to_its_node_and_stops_everything(tmp_path: Path) -> None:
    control, invocation, invocation_grpc, compute, nats = _free_ports(5)
    _configs(tmp_path / "config", control, invocation, invocation_grpc, compute)
    base = tmp_path / "split"
    base.mkdir()
    args = ["up-split", "--config-dir", str(tmp_path / "config"), "--state-dir", str(base)]
    platform = Platform([*args, "--nats-port", str(nats)], base / "control")
    try:
        _wait_for(platform, "split deployment is ready")
        banner = platform.stdout()
        assert f"control     http://127.0.0.1:{control}" in banner
        assert f"invocation  http://127.0.0.1:{invocation}" in banner
        # The control node's endpoints.json knows the whole deployment; the compute node's says it serves
        # neither API.
        doc = json.loads((base / "control" / "endpoints.json").read_text())
        assert doc["role"] == "control"
        assert doc["api_url"] == f"http://127.0.0.1:{control}"
        assert doc["invocation_url"] == f"http://127.0.0.1:{invocation}"
        assert doc["grpc_url"] == f"127.0.0.1:{invocation_grpc}"
        compute_doc = json.loads((base / "compute" / "endpoints.json").read_text())
        assert compute_doc["api_url"] is None and compute_doc["invocation_url"] is None
        # A path sent to the wrong node says where it is served.
        status, problem = _post(f"http://127.0.0.1:{control}/v2/nvcf/pexec/functions/f", b"{}")
        assert status == 404 and f"http://127.0.0.1:{invocation} does" in problem["detail"]
        status, body = get(f"http://127.0.0.1:{invocation}/v2/nvcf/functions")
        assert status == 404 and f"http://127.0.0.1:{control} does" in json.loads(body)["detail"]

        env = cli_env(NVCF_MONO_STATE_DIR=str(base / "control"))
        created = run_cli(
            "function", "create", "--name", "split-echo", "--image", "echo", "--inference-url", "/echo",
            "--inference-port", "8000", "--health-uri", "/health", "--json", env=env,
        )  # fmt: skip
        assert created.returncode == 0, created.stderr
        function = json.loads(created.stdout)["function"]
        deployed = run_cli(
            "deploy", "create", function["id"], function["versionId"], "--gpu", "H100",
            "--instance-type", "ON-PREM.GPU.H100_1x", env=env,
        )  # fmt: skip
        assert deployed.returncode == 0, deployed.stderr
        invoked = run_cli("invoke", function["id"], "-d", '{"message": "split"}', "--json", env=env)
        assert invoked.returncode == 0, invoked.stderr
        assert json.loads(invoked.stdout)["response"]["message"] == "split"
        # The control node mints a function key as all-in-one does: curl and OpenAI's clients reach the
        # invocation node (pexec, the LLM gateway) with it.
        key = json.loads((base / "control" / "endpoints.json").read_text())["credentials"]["api_key"]
        assert key, "no function key in the control node's endpoints.json"
        url = f"http://127.0.0.1:{invocation}/v2/nvcf/pexec/functions/{function['id']}"
        assert _post(url, b'{"message": "with a key"}', key) == (200, {"message": "with a key", "reqid": ANY})
        with openai.OpenAI(base_url=f"http://127.0.0.1:{invocation}/v1", api_key=key, max_retries=0) as llm:
            assert [m.id for m in llm.models.list()] == []  # authenticated: no function here serves a model
        # The compute node's directory says where neither API is: a clear error, not a 404.
        lost = run_cli("invoke", function["id"], "-d", "{}", env=cli_env(NVCF_MONO_STATE_DIR=str(base / "compute")))
        assert lost.returncode == 2 and "peers.invocation_url" in lost.stderr

        platform.signal(signal.SIGINT)
        assert platform.wait(timeout=90) == 0, platform.stderr()[-3000:]
        err = platform.stderr()
        assert "draining the roles" in err
        assert "Traceback" not in err
        for role in ("control", "invocation", "compute"):
            assert f"[{role}] " in err and "nvcf_mono.host: stopped" in err
        assert nats_servers_on(base) == []
        # Instances included: their processes work in directories under the state directory.
        assert processes_under(base) == [], "a process of the deployment is left"
    finally:
        platform.stop()


def test_up_split_refuses_a_busy_nats_port_in_one_line(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        done = run_cli("up-split", "--state-dir", str(tmp_path / "s"), "--nats-port", str(busy.getsockname()[1]))
    assert done.returncode == 2
    assert "is in use" in done.stderr and "Traceback" not in done.stderr
