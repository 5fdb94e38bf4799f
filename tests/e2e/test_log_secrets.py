"""No secret reaches a log: ``nvcf-mono up`` at DEBUG through a whole scenario, every log grepped.

The platform runs as users run it (a child process, a local cluster, real instances). The scenario
mints an account key, stores registry credentials, creates a function with secrets and sets more,
deploys it, invokes it (a 202 and a status poll included), launches a task with secrets, and sends
requests aiohttp cannot parse carrying a token. Then the platform's stdout and stderr and every log
file under its state directory (its children's: instances, workers, nats-server) are searched for
each secret value, key and token the test set or read from ``endpoints.json``.
"""

from __future__ import annotations

import base64
import json
import secrets
import signal
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.cli import Platform, fast_flags

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ECHO_PORT = 8000


def call(
    base: str,
    method: str,
    path: str,
    token: str,
    body: Any = None,
    *,
    headers: dict[str, str] | None = None,
    timeout: float = 30,
) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of one API call."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(base + path, data=data, method=method)
    request.add_header("Authorization", f"Bearer {token}")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    for name, value in (headers or {}).items():
        request.add_header(name, value)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            return reply.status, dict(reply.headers), reply.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def ok(reply: tuple[int, dict[str, str], bytes], status: int = 200) -> Any:
    assert reply[0] == status, reply
    return json.loads(reply[2]) if reply[2] else None


def until(probe: Any, what: str, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = probe()
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def raw_request(url: str, payload: bytes) -> bytes:
    """Send bytes aiohttp cannot parse; the answer."""
    host, port = url.removeprefix("http://").rstrip("/").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(payload)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def token(label: str) -> str:
    """A secret value no log line could contain by chance."""
    return f"{label}-{secrets.token_hex(12)}"


def test_no_secret_value_key_or_token_appears_in_any_log(tmp_path: Path) -> None:
    state = tmp_path / "state"
    platform = Platform(["up", *fast_flags(state), "--set", "logging.level=DEBUG"], state)
    hidden: dict[str, str] = {}
    try:
        endpoints = platform.wait_ready()
        hidden |= {name: value for name, value in endpoints["credentials"].items() if value}
        user_info = endpoints["nats_url"].removeprefix("nats://").partition("@")
        if user_info[1]:
            hidden["NATS password"] = user_info[0].partition(":")[2]
        hidden["platform secret"] = (state / "platform-secret").read_text().splitlines()[0].strip()
        admin, task_key = hidden["admin_token"], hidden["task_api_key"]
        api, invocation = endpoints["api_url"], endpoints["invocation_url"]

        # An account key that may deploy and invoke.
        policy = {
            "product": "nv-cloud-functions",
            "scopes": ["register_function", "deploy_function", "invoke_function", "list_functions", "update_secrets"],
            "resources": [{"type": "account-functions", "id": "*"}],
        }
        minted = ok(
            call(api, "POST", "/v1/keys", admin, {"description": "log test", "authorizations": {"policies": [policy]}})
        )
        key = hidden["minted key"] = minted["value"]

        # Registry credentials (the password travels base64-encoded: both spellings are secret).
        password = hidden["registry password"] = token("registry-PASSWORD")
        basic = hidden["registry basic auth"] = base64.b64encode(f"robot:{password}".encode()).decode()
        credential = {
            "registryHostname": "registry.example.com",
            "secret": {"name": "cred-example", "value": basic},
            "artifactTypes": ["CONTAINER"],
        }
        ok(call(api, "POST", "/v2/nvcf/registry-credentials", admin, credential))

        # A function with secrets, deployed on the local cluster with the echo image, and more secrets set.
        first = hidden["function secret"] = token("function-SECRET")
        nested = hidden["function secret object"] = token("nested-SECRET")
        function = {
            "name": "log-secrets",
            "inferenceUrl": "/echo",
            "inferencePort": ECHO_PORT,
            "containerImage": "echo",
            "health": {
                "protocol": "HTTP",
                "uri": "/health",
                "port": ECHO_PORT,
                "timeout": "PT10S",
                "expectedStatusCode": 200,
            },
            "secrets": [{"name": "FIRST", "value": first}, {"name": "NESTED", "value": {"inner": nested}}],
        }
        fn = ok(call(api, "POST", "/v2/nvcf/functions", key, function))["function"]
        fid, vid = fn["id"], fn["versionId"]
        later = hidden["updated secret"] = token("updated-SECRET")
        secrets_path = f"/v2/nvcf/secrets/functions/{fid}/versions/{vid}"
        ok(call(api, "PUT", secrets_path, key, {"secrets": [{"name": "LATER", "value": later}]}), 204)
        clusters = ok(call(api, "GET", "/v1/accounts/nvcf-default/clusters", admin))["clusters"]
        gpu = clusters[0]["gpus"][0]
        spec = {
            "gpu": gpu["name"],
            "instanceType": gpu["instanceTypes"][0]["name"],
            "minInstances": 1,
            "maxInstances": 1,
        }
        deployment = f"/v2/nvcf/deployments/functions/{fid}/versions/{vid}"
        ok(call(api, "POST", deployment, key, {"deploymentSpecifications": [spec]}))

        def active() -> bool:
            shown = ok(call(api, "GET", deployment, key))["deployment"]
            assert shown["functionStatus"] in ("DEPLOYING", "ACTIVE"), shown
            return bool(shown["functionStatus"] == "ACTIVE")

        until(active, "the function to be ACTIVE", timeout=90)

        # Invoke: an answer at once, then one that outlasts its poll window and is fetched by a status poll.
        pexec = f"/v2/nvcf/pexec/functions/{fid}"
        assert ok(call(invocation, "POST", pexec, key, {"message": "hi"}))["message"] == "hi"
        waiting = call(
            invocation, "POST", pexec, key, {"message": "late", "delay": 2}, headers={"NVCF-POLL-SECONDS": "1"}
        )
        assert waiting[0] == 202, waiting
        request_id = waiting[1]["NVCF-REQID"]
        polled = call(
            invocation, "GET", f"/v2/nvcf/pexec/status/{request_id}", key, headers={"NVCF-POLL-SECONDS": "20"}
        )
        assert ok(polled)["message"] == "late"

        # A task with secrets (the task key), left to run.
        task_secret = hidden["task secret"] = token("task-SECRET")
        task = {
            "name": "log-secrets-task",
            "containerImage": "task-example",
            "containerArgs": "--steps 2 --seconds 1",
            "gpuSpecification": {"gpu": spec["gpu"], "instanceType": spec["instanceType"]},
            "resultHandlingStrategy": "NONE",
            "secrets": [{"name": "TASK_SECRET", "value": task_secret}],
        }
        launched = ok(call(api, "POST", "/v1/nvct/tasks", task_key, task))["task"]
        ok(call(api, "GET", f"/v1/nvct/tasks/{launched['id']}", task_key))

        # Requests aiohttp cannot parse, carrying tokens: the answer is a problem and no log quotes them.
        too_long = raw_request(
            invocation,
            f"GET /v2/nvcf/functions HTTP/1.1\r\nHost: x\r\nX-Leak: {admin}{'a' * 9000}\r\n\r\n".encode(),
        )
        assert b"application/problem+json" in too_long and admin.encode() not in too_long, too_long[:300]
        latin1 = f"Authorization: Bearer {key}\xe9".encode("latin-1")
        odd = raw_request(
            invocation, b"GET /v2/nvcf/functions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + latin1 + b"\r\n\r\n"
        )
        assert odd.startswith(b"HTTP/1.1 401"), odd[:300]

        platform.signal(signal.SIGTERM)
        assert platform.wait(timeout=60) == 0
    finally:
        platform.stop()

    logs = {"stdout": platform.stdout(), "stderr": platform.stderr()}
    for path in state.rglob("*.log"):
        logs[str(path.relative_to(state))] = path.read_text(errors="replace")
    assert "DEBUG" in logs["stderr"], "the platform did not log at DEBUG"
    assert any("worker" in name for name in logs), sorted(logs)  # the instances' own logs were searched too
    leaks = [
        f"{what} in {name}: …{text[max(0, text.find(value) - 80) : text.find(value) + len(value) + 20]}…"
        for what, value in hidden.items()
        for name, text in logs.items()
        if value in text
    ]
    assert not leaks, "\n".join(leaks)
