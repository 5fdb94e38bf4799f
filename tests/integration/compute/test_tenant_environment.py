"""A tenant's environment never reaches the host: the attack of a hostile second account, tried through
a function, a task, a version stored before the rule, and an instance the control plane launches anyway.

The attack is the one that worked: ``PYTHONWARNINGS`` names an importable module whose import opens a
browser, and ``BROWSER`` is a shell command. Each attempt must be refused with a 400 naming the
variable (or, past the API, by the agent), and the command must never run (no marker file).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from nvcf_mono.bus.codec import TypedKV
from nvcf_mono.contracts import buckets
from nvcf_mono.models.common import KeyValue
from nvcf_mono.structure import evolve
from nvcf_mono.testing.platform import Api, deployment, wait_for, wait_status

from .conftest import CLUSTER_A, Platform, cluster_pids, compute_platform, create, deploy, environ_of, function, spec


def browser_attack(marker: Path) -> list[dict[str, str]]:
    return [
        {"key": "PYTHONWARNINGS", "value": "ignore::antigravity.Nothing"},
        {"key": "BROWSER", "value": f"/bin/sh -c 'touch {marker}' %s"},
    ]


def attacks(marker: Path) -> list[tuple[str, list[dict[str, str]]]]:
    """(the variable the refusal names, the environment) for each attempt."""
    one = [
        ("LD_PRELOAD", f"{marker}.so"),
        ("BASH_ENV", f"{marker}.sh"),
        ("NODE_OPTIONS", f"--require {marker}.js"),
        ("PATH", f"{marker.parent}:/usr/bin:/bin"),
        ("HOME", str(marker.parent)),
        ("NVCF_WORKER_TOKEN", "nvcft_forged"),
        ("nvcf_worker_token", "nvcft_forged"),
        ("pythonwarnings", "ignore::antigravity.Nothing"),
        ("Ld_Preload", f"{marker}.so"),
        ("PYTHONPATH", str(marker.parent)),
        ("GLIBC_TUNABLES", "glibc.malloc.mxfast=1"),
        ("NVIDIA_VISIBLE_DEVICES", "all"),
        ("SECRETS_FILE", "/etc/shadow"),
        ("LD_PRELOAD=", "x"),
    ]
    return [("PYTHONWARNINGS", browser_attack(marker)), *((k, [{"key": k, "value": v}]) for k, v in one)]


def attacked(cluster_id: str) -> list[int]:
    """Processes of the cluster started with the attack's variables (other tests' instances may run beside)."""
    found = []
    for pid in cluster_pids(cluster_id):
        try:
            if "PYTHONWARNINGS" in environ_of(pid):
                found.append(pid)
        except OSError:
            continue  # gone meanwhile
    return found


def assert_refused(reply: Any, variable: str) -> None:
    assert reply.status == 400, (variable, reply.status, reply.body)
    assert reply.headers["Content-Type"].startswith("application/problem+json")
    assert repr(variable) in reply.json["detail"], reply.json["detail"]


async def second_account(p: Platform) -> tuple[Api, Api]:
    """A function key (register + deploy) and a task key (launch only) of another account."""
    assert (await p.admin.post("/v2/nvcf/accounts/team-b", {"name": "Team B"})).status == 200

    async def mint(product: str, scopes: list[str], resource: str) -> Api:
        policy = {"product": product, "scopes": scopes, "resources": [{"id": "*", "type": resource}]}
        body = {"description": "tenant", "nca_id": "team-b", "authorizations": {"policies": [policy]}}
        reply = await p.admin.post("/v1/keys", body)
        assert reply.status == 200, reply.body
        return p.api(reply.json["value"])

    functions = await mint(
        "nv-cloud-functions", ["register_function", "deploy_function", "list_functions"], "account-functions"
    )
    tasks = await mint("nv-cloud-tasks", ["launch_task"], "account-tasks")
    return functions, tasks


def test_the_attack_runs_a_command_where_nothing_refuses_it(tmp_path: Path) -> None:
    """The payload the tests send is live: given to this Python, it runs the tenant's command."""
    marker = tmp_path / "ran"
    environ = {"PATH": "/usr/bin:/bin", **{e["key"]: e["value"] for e in browser_attack(marker)}}
    subprocess.run([sys.executable, "-c", "pass"], env=environ, check=True, capture_output=True, timeout=60)
    for _ in range(200):  # the browser command runs in the background
        if marker.exists():
            break
        time.sleep(0.05)
    assert marker.exists()


@pytest.mark.slow
async def test_a_second_account_cannot_run_code_on_the_host_through_a_function_or_a_task(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    async with compute_platform(tmp_path) as p:
        functions, tasks = await second_account(p)
        for variable, environment in attacks(marker):
            body = function("attack", containerEnvironment=environment)
            assert_refused(await functions.post("/v2/nvcf/functions", body), variable)
            task = {
                "name": "attack",
                "containerImage": "echo",
                "containerEnvironment": environment,
                "gpuSpecification": {"gpu": "H100", "instanceType": "ON-PREM.GPU.H100_1x"},
            }
            assert_refused(await tasks.post("/v1/nvct/tasks", task), variable)
        # Harmless variables, and Python's own flags, still go through.
        fine = [{"key": "GREETING", "value": "hi"}, {"key": "PYTHONUNBUFFERED", "value": "1"}]
        assert (await functions.post("/v2/nvcf/functions", function("fine", containerEnvironment=fine))).status == 200
        assert (await functions.get("/v2/nvcf/functions")).json["functions"][0]["name"] == "fine"
        await anyio.sleep(1)
        assert not marker.exists() and attacked(CLUSTER_A) == []


@pytest.mark.slow
async def test_a_version_stored_before_the_rule_is_refused_at_deploy_and_by_the_agent(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    async with compute_platform(tmp_path) as p:
        versions = TypedKV(p.bus.kv(buckets.FUNCTIONS.name), buckets.FUNCTION)
        attack = tuple(KeyValue(key=e["key"], value=e["value"]) for e in browser_attack(marker))

        async def poison(fid: str, vid: str) -> None:
            """What a version written before the rule looks like: the attack in its stored environment."""
            key = buckets.version_key(fid, vid)
            stored = await versions.get(key)
            assert stored is not None
            await versions.put(key, evolve(stored.value, container_environment=attack))

        fid, vid, d = await create(p.admin, function("old"))
        await poison(fid, vid)
        await anyio.sleep(0.5)  # the control plane's cache follows the bucket
        refused = await p.admin.post(d, {"deploymentSpecifications": [spec()]})
        assert refused.status == 400 and "cannot be deployed" in refused.json["detail"]
        assert "'PYTHONWARNINGS'" in refused.json["detail"]

        # Deployed before the rule, scaled up after: the control plane launches it, the agent refuses it.
        fid, vid, d = await create(p.admin, function("deployed"))
        dep = await deploy(p.admin, d, spec(min_instances=0))
        await wait_status(p.admin, d, "ACTIVE")
        await poison(fid, vid)
        await anyio.sleep(0.5)
        spec_id = dep["deploymentSpecifications"][0]["gpuSpecificationId"]
        patched = await p.admin.patch(
            f"/v2/nvcf/deployments/{dep['deploymentId']}/gpu-specifications/{spec_id}", {"minInstances": 1}
        )
        assert patched.status == 200, patched.body

        async def refused_by_the_agent() -> str | None:
            placement = (await deployment(p.admin, d))["deploymentSpecifications"][0]["placement"]
            return placement.get("lastFailure") if placement.get("failedInstances") else None

        error = await wait_for(refused_by_the_agent, timeout=30, what="the agent to refuse the instance")
        assert "'PYTHONWARNINGS' is not allowed" in error and "refused by the cluster's agent" in error, error
        await anyio.sleep(1)
        assert not marker.exists() and attacked(CLUSTER_A) == []
