"""Autoscaling end to end on the local backend: scale from zero, back to zero, on load, and wait reasons.

Timers are seconds instead of minutes (samples a second apart, an idle timeout of a few seconds);
instances are real processes (the test echo server and its worker).
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from nvcf_mono.testing.platform import Api, deployment, wait_for, wait_status

from .conftest import Platform, all_gone, cluster, cluster_pids, compute_platform, create, deploy, function, spec

AUTOSCALE: dict[str, str] = {
    "plugins.control.autoscaler.interval": "0.3",
    "plugins.control.autoscaler.sample_step": "0.5",
    "plugins.control.autoscaler.lookback": "2",
    "plugins.control.autoscaler.utilization_window": "1",
    "plugins.control.autoscaler.idle_timeout": "3",
    "plugins.control.autoscaler.worker_stale": "2",
    "plugins.invocation.load_report_interval": "0.2",
    # Slow to become healthy: long enough for a 1 s poll window to end first.
    "images.slow.command": json.dumps(
        ["sh", "-c", "sleep 2.5; exec {python} -m nvcf_mono.testing.echo_server --port {port}"]
    ),
    "images.crashy.command": json.dumps(["{python}", "-c", "import sys, time; time.sleep(0.3); sys.exit(3)"]),
}


@asynccontextmanager
async def scaling_platform(tmp_path: Path, gpus: int = 8) -> AsyncIterator[tuple[Platform, str]]:
    """The platform with fast autoscaling on its own cluster; every deployment removed at the end
    (the local backend leaves instances running when its agent stops, for the next agent to adopt)."""
    cluster_id = str(uuid.uuid4())
    async with compute_platform(tmp_path, clusters=[cluster("local", cluster_id, count=gpus)], **AUTOSCALE) as p:
        try:
            yield p, cluster_id
        finally:
            with anyio.CancelScope(shield=True):
                for fn in (await p.admin.get("/v2/nvcf/functions")).json["functions"]:
                    await p.admin.delete(f"/v2/nvcf/deployments/functions/{fn['id']}/versions/{fn['versionId']}")
                await all_gone(cluster_pids(cluster_id), timeout=45)


def placement(dep: dict[str, Any]) -> dict[str, Any]:
    p: dict[str, Any] = dep["deploymentSpecifications"][0]["placement"]
    return p


async def placed(
    api: Api, d: str, count: int, *, timeout: float = 30.0, running: bool = True, at_least: bool = False
) -> dict[str, Any]:
    """Wait until the spec has exactly ``count`` (``at_least``: that many or more) running (or live) instances."""

    seen: list[tuple[int, int]] = []  # (placed, running) as it changed, for the failure message

    async def probe() -> dict[str, Any] | None:
        p = placement(await deployment(api, d))
        state = (p["placedInstances"], p["runningInstances"])
        if not seen or seen[-1] != state:
            seen.append(state)
        have = p["runningInstances"] if running else p["placedInstances"]
        if at_least:
            return p if have >= count else None
        return p if have == count and (not running or p["placedInstances"] == count) else None

    try:
        return await wait_for(probe, timeout=timeout, what=f"{count} instance(s)")
    except AssertionError as err:
        raise AssertionError(f"{err}; (placed, running) went {seen}") from None


async def invoke(api: Api, fid: str, body: dict[str, Any], **headers: str) -> Any:
    return await api.post(f"/v2/nvcf/pexec/functions/{fid}", body, headers=headers)


@pytest.mark.slow
async def test_a_version_at_zero_wakes_on_a_request_goes_back_to_zero_and_wakes_again(tmp_path: Path) -> None:
    async with scaling_platform(tmp_path) as (p, cluster_id):
        fid, _, d = await create(p.admin, function())
        await deploy(p.admin, d, spec(min_instances=0, max_instances=2))
        await wait_status(p.admin, d, "ACTIVE")
        assert placement(await deployment(p.admin, d))["placedInstances"] == 0
        assert cluster_pids(cluster_id) == []

        started = time.monotonic()
        reply = await invoke(p.key, fid, {"message": "wake"})
        assert reply.status == 200, reply.body
        assert reply.json["message"] == "wake"
        first_cold = time.monotonic() - started
        # One instance, or two where a slow cold start let the backlog ask for the second (max 2).
        await placed(p.admin, d, 1, at_least=True)
        assert cluster_pids(cluster_id)

        # Idle past the timeout: back to zero, every process gone.
        p0 = await placed(p.admin, d, 0, timeout=30)
        assert "scale to zero" in (p0.get("autoscaler") or ""), p0

        async def no_processes() -> bool:
            return cluster_pids(cluster_id) == []

        await wait_for(no_processes, timeout=15, what="the instance's processes to end")

        reply = await invoke(p.key, fid, {"message": "again"})
        assert reply.status == 200 and reply.json["message"] == "again", reply.body

        async def cold_starts() -> str | None:
            async with p.admin.session.get(f"{p.admin.base}/metrics") as resp:
                text = await resp.text()
            counts = [line for line in text.splitlines() if line.startswith("nvcf_autoscaler_cold_start_seconds_count")]
            return text if counts and float(counts[0].rsplit(" ", 1)[1]) >= 2 else None

        metrics = await wait_for(cold_starts, timeout=5, what="two cold starts measured")
        assert re.search(
            r'^nvcf_autoscaler_decisions_total\{function_id="[^"]+",function_version_id="[^"]+",kind="wake"\} ',
            metrics,
            re.M,
        )
        assert first_cold < 30


@pytest.mark.slow
async def test_200_concurrent_requests_at_zero_all_succeed(tmp_path: Path) -> None:
    async with scaling_platform(tmp_path) as (p, _cluster_id):
        fid, _, d = await create(p.admin, function())
        await deploy(p.admin, d, spec(min_instances=0, max_instances=2, maxRequestConcurrency=8))
        await wait_status(p.admin, d, "ACTIVE")
        answers: list[tuple[int, Any]] = []

        async def one(i: int) -> None:
            reply = await invoke(p.key, fid, {"message": str(i)})
            answers.append((reply.status, reply.json.get("message") if reply.status == 200 else reply.body))

        async with anyio.create_task_group() as tg:
            for i in range(200):
                tg.start_soon(one, i)
        assert sorted(answers, key=lambda a: int(a[1]) if a[0] == 200 else -1) == [(200, str(i)) for i in range(200)], [
            a for a in answers if a[0] != 200
        ][:5]


@pytest.mark.slow
async def test_sustained_load_grows_to_max_and_quiet_brings_it_back_to_min(tmp_path: Path) -> None:
    async with scaling_platform(tmp_path) as (p, _cluster_id):
        fid, _, d = await create(p.admin, function())
        await deploy(p.admin, d, spec(min_instances=1, max_instances=3))
        await wait_status(p.admin, d, "ACTIVE")
        await placed(p.admin, d, 1)
        failures: list[Any] = []

        async def client(stop: anyio.Event) -> None:
            while not stop.is_set():
                reply = await invoke(p.key, fid, {"message": "x", "delay": 0.2})
                if reply.status != 200:
                    failures.append((reply.status, reply.body))

        stop = anyio.Event()
        async with anyio.create_task_group() as tg:
            for _ in range(4):
                tg.start_soon(client, stop)
            grown = await placed(p.admin, d, 3, timeout=60)
            stop.set()
        assert failures == []
        assert grown["desiredInstances"] == 3
        # Quiet: down to min (1), never below it.
        down = await placed(p.admin, d, 1, timeout=60)
        assert down["desiredInstances"] == 1
        await anyio.sleep(4)  # past the idle timeout: minInstances still holds one
        assert placement(await deployment(p.admin, d))["runningInstances"] == 1


@pytest.mark.slow
async def test_wait_reasons_say_why_a_request_waits(tmp_path: Path) -> None:
    async with scaling_platform(tmp_path, gpus=1) as (p, _):
        # cold_starting: the version is at zero and its instance takes longer than the poll window.
        slow_fid, _, slow = await create(p.admin, function("slow", containerImage="slow"))
        await deploy(p.admin, slow, spec(min_instances=0, max_instances=1))
        await wait_status(p.admin, slow, "ACTIVE")
        reply = await invoke(p.key, slow_fid, {"message": "patience"}, **{"NVCF-POLL-SECONDS": "1"})
        assert reply.status == 202, reply.body
        assert reply.headers["NVCF-WAIT-REASON"] == "cold_starting"
        rid = reply.headers["NVCF-REQID"]

        async def answered() -> Any:
            polled = await p.key.get(f"/v2/nvcf/pexec/status/{rid}", headers={"NVCF-POLL-SECONDS": "5"})
            return polled if polled.status == 200 else None

        done = await wait_for(answered, timeout=30, what="the cold-started answer")
        assert done.json["message"] == "patience"

        # no_capacity: the only GPU is held by a function whose minInstances keeps it.
        await p.admin.delete(slow)
        _, _, holder = await create(p.admin, function("holder"))
        await deploy(p.admin, holder, spec(min_instances=1, max_instances=1))
        await wait_status(p.admin, holder, "ACTIVE")
        fid, _, d = await create(p.admin, function("starved"))
        await deploy(p.admin, d, spec(min_instances=0, max_instances=1))
        await wait_status(p.admin, d, "ACTIVE")
        await reason_becomes(p.key, fid, "no_capacity")

        # instance_failing: an inference server that crashes at start.
        await p.admin.delete(holder)
        await p.admin.delete(d)
        crash_fid, _, crash = await create(p.admin, function("crashy", containerImage="crashy"))
        await deploy(p.admin, crash, spec(min_instances=0, max_instances=1))
        await wait_status(p.admin, crash, "ACTIVE")
        await reason_becomes(p.key, crash_fid, "instance_failing")


async def reason_becomes(api: Api, fid: str, reason: str) -> None:
    """Invoke with a 1 s poll window, then poll the request until its wait reason is ``reason``."""
    reply = await invoke(api, fid, {"message": "wait"}, **{"NVCF-POLL-SECONDS": "1"})
    assert reply.status == 202, reply.body
    rid = reply.headers["NVCF-REQID"]
    seen: list[str] = []

    async def probe() -> bool:
        polled = await api.get(f"/v2/nvcf/pexec/status/{rid}", headers={"NVCF-POLL-SECONDS": "1"})
        assert polled.status == 202, polled.body
        seen.append(polled.headers["NVCF-WAIT-REASON"])
        return seen[-1] == reason

    await wait_for(probe, timeout=30, what=f"wait reason {reason} (seen {seen})")


@pytest.mark.slow
async def test_scaling_down_removes_the_idle_instance_and_lets_the_busy_one_finish(tmp_path: Path) -> None:
    async with scaling_platform(tmp_path) as (p, _):
        fid, _, d = await create(p.admin, function())
        await deploy(p.admin, d, spec(min_instances=0, max_instances=2, maxRequestConcurrency=4))
        await wait_status(p.admin, d, "ACTIVE")
        answers: dict[str, Any] = {}

        # The long call may queue behind the short ones on a loaded machine: more than the usual 10 s.
        patient = Api(p.key.session, p.key.base, p.key.token, timeout=30, checker=p.key.checker)

        async def call(name: str, delay: float) -> None:
            reply = await invoke(patient, fid, {"message": name, "delay": delay})
            answers[name] = (reply.status, reply.json.get("message") if reply.status == 200 else reply.body)

        async with anyio.create_task_group() as tg:
            # Four fill the first instance's slots; the long one then goes to the second, newer instance
            # (newest first would be the wrong choice to remove).
            for i in range(4):
                tg.start_soon(call, f"short-{i}", 2.0)

            async def serving() -> bool:  # (a full instance may already have asked for a second one)
                return bool(placement(await deployment(p.admin, d))["runningInstances"] >= 1)

            await wait_for(serving, timeout=30, what="the first instance running")
            tg.start_soon(call, "long", 8.0)
            tg.start_soon(call, "short-4", 1.0)
            await placed(p.admin, d, 2, timeout=30)
            # The short ones end; one slot of eight is busy (12 %): down to one, never the busy instance.
            one = await placed(p.admin, d, 1, timeout=20)
            assert "long" not in answers
            assert one["desiredInstances"] == 1
        assert answers["long"] == (200, "long"), answers
        assert all(answers[f"short-{i}"] == (200, f"short-{i}") for i in range(5)), answers
        # Idle past the timeout once the long one is done: zero.
        await placed(p.admin, d, 0, timeout=30)


async def test_plugin_policies_decide_for_their_functions_and_a_failing_one_falls_back(tmp_path: Path) -> None:
    plugin = {"extra_plugins": "[tests.support.plugins:Policies]", "plugins.test_policies.enabled": "true"}
    cluster_id = str(uuid.uuid4())
    async with compute_platform(tmp_path, clusters=[cluster("local", cluster_id)], **AUTOSCALE, **plugin) as p:
        try:
            _, _, fixed = await create(p.admin, function("fixed"))
            await deploy(p.admin, fixed, spec(min_instances=0, max_instances=3))
            _, _, broken = await create(p.admin, function("broken"))
            await deploy(p.admin, broken, spec(min_instances=1, max_instances=3))

            async def decided() -> tuple[dict[str, Any], dict[str, Any]] | None:
                two, one = placement(await deployment(p.admin, fixed)), placement(await deployment(p.admin, broken))
                done = two.get("runningInstances") == 2 and one.get("runningInstances") == 1
                return (two, one) if done and one.get("autoscaler") else None

            two, one = await wait_for(decided, timeout=40, what="both versions scaled")
            assert (
                two["autoscaler"].startswith("2 instance(s)")
                and "policy two_for_fixed: always two" in two["autoscaler"]
            )
            assert "policy" not in one["autoscaler"], one  # the broken policy raised: NVCF's algorithm decided
        finally:
            with anyio.CancelScope(shield=True):
                for d in (fixed, broken):
                    await p.admin.delete(d)
                await all_gone(cluster_pids(cluster_id), timeout=45)
