"""Instance health on the local backend: launch failures, restarts, crash loops, start timeouts, degradation."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import pytest

from nvcf_mono.contracts import rpc, subjects
from nvcf_mono.contracts.agent import AgentLogs, AgentQuery
from nvcf_mono.testing.platform import deployment, wait_for, wait_status

from .conftest import (
    CLUSTER_A,
    all_gone,
    cluster_pids,
    compute_platform,
    create,
    deploy,
    function,
    instances,
    pids,
    running,
    spec,
)

IMAGES = {
    "images.broken.command": json.dumps(["/nonexistent/bin/server", "--port", "{port}"]),
    "images.crashy.command": json.dumps(
        ["{python}", "-c", "import sys, time; print('boom'); time.sleep(0.3); sys.exit(3)"]
    ),
    "images.mute.command": json.dumps(["{python}", "-c", "import time; time.sleep(600)"]),
}


async def test_a_command_that_does_not_exist_is_an_error_within_seconds(tmp_path: Path) -> None:
    async with compute_platform(tmp_path, **IMAGES) as p:
        _, _, d = await create(p.admin, function("broken", containerImage="broken"))
        await deploy(p.admin, d, spec())
        dep = await wait_status(p.admin, d, "ERROR", timeout=10)
        error = dep["healthInfo"][0]["error"]
        assert "image-pull-issues" in error and "/nonexistent/bin/server" in error and "does not exist" in error

        _, _, unknown = await create(p.admin, function("unknown", containerImage="nvcr.io/acme/nothing:1.0"))
        await deploy(p.admin, unknown, spec())
        dep = await wait_status(p.admin, unknown, "ERROR", timeout=10)
        error = dep["healthInfo"][0]["error"]
        assert "'nvcr.io/acme/nothing:1.0' is not in this cluster's image catalog" in error and "echo" in error
        assert cluster_pids(CLUSTER_A) == []


@pytest.mark.slow
async def test_a_crash_loop_fails_the_instance_and_it_is_placed_again(tmp_path: Path) -> None:
    settings = {**IMAGES, "plugins.control.reconcile.deploy_failure_limit": "5"}
    async with compute_platform(tmp_path, **settings) as p:
        _, _, d = await create(p.admin, function("crashy", containerImage="crashy"))
        await deploy(p.admin, d, spec())

        async def replaced() -> list | None:
            held = await instances(p.bus, CLUSTER_A, finished=True)
            failed = [v for v in held if v.instance.state == "container-restart-loop"]
            return held if failed and len({v.request_id for v in held}) >= 2 else None

        held = await wait_for(replaced, timeout=30, what="a crash loop, then a new instance")
        failed = next(v.instance for v in held if v.instance.state == "container-restart-loop")
        assert failed.restarts >= 3 and failed.termination_cause == "container-restart-loop"
        assert failed.error_log is not None and "exited with code 3" in failed.error_log and "boom" in failed.error_log
        dep = await deployment(p.admin, d)
        assert dep["functionStatus"] in ("DEPLOYING", "ERROR")
        placement = dep["deploymentSpecifications"][0]["placement"]
        assert placement["failedInstances"] >= 1 and "container-restart-loop" in placement["lastFailure"]
        logs = await rpc.call(
            p.bus, subjects.agent_subject("logs", CLUSTER_A), AgentQuery(instance_id=failed.instance_id), AgentLogs
        )
        inference = next(log for log in logs.logs if log.name == "inference")
        assert inference.text.count("boom") >= 3 and "starting the inference server again" in inference.text
        await p.admin.delete(d)


@pytest.mark.slow
async def test_a_crash_is_restarted_in_place_and_counted(tmp_path: Path) -> None:
    async with compute_platform(tmp_path) as p:
        fid, _, d = await create(p.admin, function())
        await deploy(p.admin, d, spec())
        await wait_status(p.admin, d, "ACTIVE")
        (before,) = await running(p.bus, CLUSTER_A)
        async with aiohttp.ClientSession() as http:
            try:
                async with http.post(f"http://127.0.0.1:{before.instance.port}/crash") as resp:
                    await resp.read()
            except aiohttp.ClientError:
                pass  # it dies mid-request

        async def restarted() -> object:
            (now,) = await instances(p.bus, CLUSTER_A)
            return now if now.instance.restarts == 1 and now.instance.state == "running" else None

        after = await wait_for(restarted, timeout=20, what="the inference server started again")
        assert after.instance.instance_id == before.instance.instance_id and after.request_id == before.request_id
        old = {p.role: p.pid for p in before.instance.processes}
        new = {p.role: p.pid for p in after.instance.processes}
        assert new["worker"] == old["worker"] and new["inference"] != old["inference"]
        await wait_status(p.admin, d, "ACTIVE")
        reply = await p.key.post(f"/v2/nvcf/pexec/functions/{fid}", {"message": "again"})
        assert reply.status == 200 and reply.json["message"] == "again"
        await p.admin.delete(d)
        await all_gone(pids([after]))


@pytest.mark.slow
async def test_never_ready_and_no_longer_ready_become_degraded_worker(tmp_path: Path) -> None:
    settings = {
        **IMAGES,
        "plugins.compute.health.start_timeout": "3",
        "plugins.compute.health.degradation_period": "2",
        "plugins.control.reconcile.deploy_failure_limit": "10",
    }
    async with compute_platform(tmp_path, **settings) as p:
        # Ready, then not: the version is DEGRADED, then the instance is replaced after the period.
        fid, _, d = await create(p.admin, function())
        await deploy(p.admin, d, spec())
        await wait_status(p.admin, d, "ACTIVE")
        (first,) = await running(p.bus, CLUSTER_A)
        async with aiohttp.ClientSession() as http, http.post(f"http://127.0.0.1:{first.instance.port}/health/fail"):
            pass
        await wait_status(p.admin, d, "DEGRADED", timeout=15)

        async def replaced() -> object:
            views = await instances(p.bus, CLUSTER_A, finished=True)
            old = next(v for v in views if v.instance.instance_id == first.instance.instance_id)
            fresh = [v for v in views if v.request_id != first.request_id and v.instance.state == "running"]
            return (old, fresh) if old.instance.state == "degraded-worker" and fresh else None

        old, _ = await wait_for(replaced, timeout=30, what="degraded-worker, then a replacement")
        assert "after it had been" in (old.instance.error_log or "")
        await all_gone(pids([first]))
        await wait_status(p.admin, d, "ACTIVE")
        reply = await p.key.post(f"/v2/nvcf/pexec/functions/{fid}", {"message": "back"})
        assert reply.status == 200
        dep = await deployment(p.admin, d)
        assert "degraded-worker" in dep["deploymentSpecifications"][0]["placement"]["lastFailure"]
        await p.admin.delete(d)

        # Never ready: degraded-worker once the start timeout passes.
        _, _, mute = await create(p.admin, function("mute", containerImage="mute"))
        await deploy(p.admin, mute, spec())

        async def timed_out() -> object:
            views = await instances(p.bus, CLUSTER_A, finished=True)
            return next(
                (v for v in views if v.instance.state == "degraded-worker" and v.request_id != first.request_id), None
            )

        view = await wait_for(timed_out, timeout=20, what="the start timeout")
        assert "not ready 3s after launch" in (view.instance.error_log or "")
        await p.admin.delete(mute)
