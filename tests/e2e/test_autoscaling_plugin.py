"""The example autoscaling policy (examples/autoscaling-policy), installed from its own package.

The package is installed into a directory of its own (``pip install --target``), so nothing else in
the suite sees it; the platform runs as a child process with that directory on its path and finds
the plugin by its entry point, as it would in a user's virtualenv. Enabled, the policy decides for
the function: its reason is the autoscaler's last decision, and the instances follow the queue.
"""

from __future__ import annotations

import concurrent.futures
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.cli import ROOT, Platform, cli_env, fast_flags
from tests.support.leftovers import kill
from tests.support.packages import install_package
from tests.support.procs import live_processes

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
EXAMPLE = ROOT / "examples" / "autoscaling-policy"
FAST_AUTOSCALER = (
    "plugins.control.autoscaler.interval=0.5",
    "plugins.control.autoscaler.sample_step=1",
    "plugins.control.autoscaler.lookback=5",
    "plugins.control.autoscaler.utilization_window=2",
    "plugins.control.autoscaler.idle_timeout=3",
)


def _call(base: str, token: str, method: str, path: str, body: Any = None, timeout: float = 30) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{base}{path}", data=data, method=method)
    request.add_header("Authorization", f"Bearer {token}")
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            raw = resp.read()
            return resp.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null")


def _instance_processes(state: Path) -> list[int]:
    """Processes working in an instance directory under ``state`` (the local backend's instances)."""
    root = state.resolve()
    return [
        p.pid for p in live_processes() if Path(p.cwd()).is_relative_to(root) and "instances" in Path(p.cwd()).parts
    ]


def test_an_installed_policy_plugin_decides_for_the_functions_it_names(tmp_path: Path) -> None:
    site = tmp_path / "site"
    install_package(EXAMPLE, site)
    assert (site / "queue_policy.py").exists()
    env = cli_env(PYTHONPATH=f"{site}:{ROOT}")

    # Installed and found by its entry point; no role turns it on by itself.
    listed = subprocess.run(
        [sys.executable, "-m", "nvcf_mono", "plugins", "--state-dir", str(tmp_path / "x")],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert listed.returncode == 0 and "queue_policy" in listed.stdout, listed.stdout + listed.stderr

    flags = ["--set", "plugins.queue_policy.enabled=true", "--set", "plugins.queue_policy.requests_per_instance=2"]
    flags += ["--set", "plugins.control.example_function=false"]
    for item in FAST_AUTOSCALER:
        flags += ["--set", item]
    state = tmp_path / "state"
    platform = Platform(["run", "--role", "all-in-one", *fast_flags(state), *flags], state, env=env)
    try:
        doc = platform.wait_ready()
        base, admin = doc["api_url"], doc["credentials"]["admin_token"]
        status, created = _call(base, admin, "POST", "/v2/nvcf/functions", {
            "name": "echo", "inferenceUrl": "/echo", "inferencePort": 9000, "containerImage": "echo",
            "health": {"protocol": "HTTP", "uri": "/health", "port": 9000, "timeout": "PT10S",
                       "expectedStatusCode": 200},
        })  # fmt: skip
        assert status == 200, created
        fid, vid = created["function"]["id"], created["function"]["versionId"]
        d = f"/v2/nvcf/deployments/functions/{fid}/versions/{vid}"
        spec = {"gpu": "H100", "instanceType": "ON-PREM.GPU.H100_1x", "minInstances": 0, "maxInstances": 3}
        status, _ = _call(base, admin, "POST", d, {"deploymentSpecifications": [{**spec, "maxRequestConcurrency": 1}]})
        assert status == 200

        # Six slow calls at once: the policy wants ceil(6 / 2) = 3 instances.
        key = doc["credentials"]["api_key"]
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            calls = [
                pool.submit(_call, base, key, "POST", f"/v2/nvcf/pexec/functions/{fid}", {"delay": 2}, 120)
                for _ in range(6)
            ]
            deadline, seen = time.monotonic() + 60, ""
            placed = 0
            while time.monotonic() < deadline:
                _, dep = _call(base, admin, "GET", d)
                placement = dep["deployment"]["deploymentSpecifications"][0].get("placement") or {}
                seen, placed = placement.get("autoscaler") or "", placement.get("desiredInstances", 0)
                if "policy queue_policy" in seen and placed == 3:
                    break
                time.sleep(0.2)
            assert "policy queue_policy" in seen and placed == 3, (seen, placed)
            assert "in flight at 2 each" in seen
            assert all(call.result()[0] == 200 for call in calls)
        # Undeployed, and its processes gone, before the platform stops: the local backend keeps
        # running instances for the next agent.
        assert _call(base, admin, "DELETE", d)[0] == 200
        deadline = time.monotonic() + 30
        while _instance_processes(state):
            assert time.monotonic() < deadline, "the instances outlived their deployment"
            time.sleep(0.2)
    finally:
        platform.stop()
        kill(_instance_processes(state))  # only after a failure above
    assert "Traceback" not in platform.stderr(), platform.stderr()
