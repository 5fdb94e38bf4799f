"""Tasks end to end on the local backend: a real task process and its worker, through the API.

The task is ``nvcf_mono.testing.task_program`` (image ``task``): it writes progress steps and result
files as the task contract says, then exits as told.
"""

from __future__ import annotations

import json
import os
import signal
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from nvcf_mono.bus.upload_room import upload_room
from nvcf_mono.contracts import buckets
from nvcf_mono.testing.platform import Api, wait_for

from .conftest import Platform, alive, all_gone, cluster, cluster_pids, compute_platform

SETTINGS: dict[str, str] = {
    "images.task.command": json.dumps(["{python}", "-m", "nvcf_mono.testing.task_program"]),
    "plugins.control.tasks.monitor_interval": "0.3",
    "plugins.control.tasks.heartbeat_interval": "0.5",
}
TERMINAL = {"COMPLETED", "ERRORED", "CANCELED", "EXCEEDED_MAX_RUNTIME_DURATION", "EXCEEDED_MAX_QUEUED_DURATION"}


@asynccontextmanager
async def task_platform(tmp_path: Path, gpus: int = 2, **more: str) -> AsyncIterator[tuple[Platform, str]]:
    cluster_id = str(uuid.uuid4())
    async with compute_platform(tmp_path, clusters=[cluster("local", cluster_id, count=gpus)], **SETTINGS, **more) as p:

        async def registered() -> bool:
            return (await p.admin.get(f"/v1/accounts/nvcf-default/clusters/{cluster_id}")).status == 200

        await wait_for(registered, timeout=15, what="the cluster")
        try:
            yield p, cluster_id
        finally:
            with anyio.CancelScope(shield=True):
                await all_gone(cluster_pids(cluster_id), timeout=20)


def task_body(name: str, args: str, **more: Any) -> dict[str, Any]:
    return {
        "name": name,
        "containerImage": "task",
        "containerArgs": args,
        "gpuSpecification": {"gpu": "H100", "instanceType": "ON-PREM.GPU.H100_1x"},
        **more,
    }


async def launch(api: Api, body: dict[str, Any]) -> str:
    reply = await api.post("/v1/nvct/tasks", body)
    assert reply.status == 200, reply.body
    assert reply.json["task"]["status"] == "QUEUED"
    task_id: str = reply.json["task"]["id"]
    return task_id


async def get_task(api: Api, task_id: str) -> dict[str, Any]:
    reply = await api.get(f"/v1/nvct/tasks/{task_id}")
    assert reply.status == 200, reply.body
    task: dict[str, Any] = reply.json["task"]
    return task


async def finished(api: Api, task_id: str, timeout: float = 45) -> dict[str, Any]:
    async def probe() -> dict[str, Any] | None:
        task = await get_task(api, task_id)
        return task if task["status"] in TERMINAL else None

    return await wait_for(probe, timeout=timeout, what=f"task {task_id} to end")


async def events(api: Api, task_id: str) -> list[str]:
    reply = await api.get(f"/v1/nvct/tasks/{task_id}/events", params={"limit": "100"})
    assert reply.status == 200, reply.body
    return [e["message"] for e in reply.json["events"]]


@pytest.mark.slow
async def test_a_task_reports_progress_and_results_and_completes(tmp_path: Path) -> None:
    async with task_platform(tmp_path) as (p, cluster_id):
        task_id = await launch(p.admin, task_body("steps", "--steps 10,50,100 --results 2 --pause 0.6"))
        seen: set[int] = set()

        async def running_with_progress() -> bool:
            task = await get_task(p.admin, task_id)
            seen.add(task.get("percentComplete", 0))
            return task["status"] in TERMINAL

        await wait_for(running_with_progress, timeout=45, interval=0.1, what="the task to end")
        task = await get_task(p.admin, task_id)
        assert task["status"] == "COMPLETED", task
        assert task["percentComplete"] == 100
        assert seen & {10, 50}, seen  # progress was followed on the way
        assert await events(p.admin, task_id) == [
            "Task created with status 'QUEUED'",
            "Changing status from 'QUEUED' to 'LAUNCHED'",
            "Changing status from 'LAUNCHED' to 'RUNNING'",
            "Changing status from 'RUNNING' to 'COMPLETED'",
        ]
        results = (await p.admin.get(f"/v1/nvct/tasks/{task_id}/results")).json["results"]
        assert sorted(r["name"] for r in results) == ["result-0.txt", "result-1.txt"]
        first = next(r for r in results if r["name"] == "result-0.txt")
        content = await p.admin.get(f"/v1/nvct/tasks/{task_id}/results/{first['resultId']}/content")
        assert content.status == 200 and content.body == f"result 0 of {task_id}\n".encode()
        (instance,) = task["instances"]
        logs = await p.admin.get(f"/v2/nvcf/instances/{instance['instanceId']}/logs")
        assert logs.status == 200, logs.body
        assert logs.json["taskId"] == task_id
        by_name = {log["name"]: log["text"] for log in logs.json["logs"]}
        assert "progress 100" in by_name["inference"] and "uploaded result result-0.txt" in by_name["worker"]
        status = await p.admin.get(f"/v1/accounts/nvcf-default/clusters/{cluster_id}/status")
        assert status.status == 200, status.body
        await all_gone(cluster_pids(cluster_id))


@pytest.mark.slow
async def test_results_past_the_size_or_count_limit_are_refused_and_leave_nothing_stored(tmp_path: Path) -> None:
    limits = {"plugins.control.tasks.max_results": "2", "plugins.control.tasks.max_result_size": "1000"}
    async with task_platform(tmp_path, **limits) as (p, _cluster_id):
        task_id = await launch(p.admin, task_body("limits", "--steps 100 --results 3 --big-result 5000"))
        task = await finished(p.admin, task_id)
        assert task["status"] == "COMPLETED", task
        results = (await p.admin.get(f"/v1/nvct/tasks/{task_id}/results")).json["results"]
        # Uploaded in name order: big.bin is too large, result-2.txt one more than the task may keep.
        assert sorted(r["name"] for r in results) == ["result-0.txt", "result-1.txt"]
        stored = await p.bus.objects(buckets.TASK_RESULT_CONTENT.name).list()
        assert len(stored) == 2, stored  # nothing refused was kept, in whole or in part
        worker = await worker_log(p.admin, task)
        assert "result big.bin was refused" in worker and "may hold 1000 bytes" in worker, worker
        assert "result result-2.txt was refused" in worker and "the most one task may keep" in worker, worker
        assert worker.count("big.bin was refused") == 1  # not sent again and again


async def worker_log(api: Api, task: dict[str, Any]) -> str:
    (instance,) = task["instances"]
    logs = await api.get(f"/v2/nvcf/instances/{instance['instanceId']}/logs")
    if logs.status != 200:  # not started yet
        return ""
    return str({log["name"]: log["text"] for log in logs.json["logs"]}.get("worker", ""))


@pytest.mark.slow
async def test_an_accounts_tasks_together_are_held_to_its_result_quota(tmp_path: Path) -> None:
    """One account's task results cannot take the room every account's uploads share."""
    async with task_platform(tmp_path, **{"plugins.control.tasks.max_account_result_bytes": "3000"}) as (p, _):
        first = await finished(p.admin, await launch(p.admin, task_body("first", "--steps 100 --big-result 2500")))
        assert [r["name"] for r in (await p.admin.get(f"/v1/nvct/tasks/{first['id']}/results")).json["results"]] == [
            "big.bin"
        ]
        # Another task of the account: 2,500 more would pass 3,000; a small result still fits.
        second = await finished(
            p.admin, await launch(p.admin, task_body("second", "--steps 100 --results 1 --big-result 2500"))
        )
        assert second["status"] == "COMPLETED", second
        kept = (await p.admin.get(f"/v1/nvct/tasks/{second['id']}/results")).json["results"]
        assert [r["name"] for r in kept] == ["result-0.txt"]
        log = await worker_log(p.admin, second)
        assert "result big.bin was refused" in log and "may keep 3000 bytes of results together" in log, log
        assert len(await p.bus.objects(buckets.TASK_RESULT_CONTENT.name).list()) == 2  # nothing refused was kept
        # Deleting the first task frees its share.
        assert (await p.admin.delete(f"/v1/nvct/tasks/{first['id']}")).status == 204
        third = await finished(p.admin, await launch(p.admin, task_body("third", "--steps 100 --big-result 2500")))
        assert [r["name"] for r in (await p.admin.get(f"/v1/nvct/tasks/{third['id']}/results")).json["results"]] == [
            "big.bin"
        ]


@pytest.mark.slow
async def test_a_result_refused_for_want_of_store_room_is_uploaded_once_there_is_room(tmp_path: Path) -> None:
    """The store's room frees as queues drain: a result it could not take is tried again, unlike one too large."""
    async with task_platform(tmp_path, **{"uploads.store_size": "16MiB"}) as (p, _):
        room = await upload_room(p.bus, p.host.settings).left()
        assert room is not None and room > 10_000
        payloads = p.bus.objects(buckets.PAYLOADS.name)
        await payloads.put("filler", _once(b"f" * (room - 1000)))  # someone else's upload, leaving 1,000 bytes
        body = task_body("waits", "--steps 10,100 --pause 8 --big-result 5000 --big-result-first")
        task_id = await launch(p.admin, body)

        async def refused_for_now() -> str | None:
            task = await get_task(p.admin, task_id)
            if not task.get("instances"):
                return None
            log = await worker_log(p.admin, task)
            return log if "uploading result big.bin failed" in log else None

        log = await wait_for(refused_for_now, timeout=30, what="the upload refused for want of room")
        assert "no more room for results" in log and "trying again later" in log and "was refused" not in log, log
        await payloads.delete("filler")  # room again

        async def uploaded() -> list[str] | None:
            results = (await p.admin.get(f"/v1/nvct/tasks/{task_id}/results")).json["results"]
            return [r["name"] for r in results] or None

        assert await wait_for(uploaded, timeout=30, what="big.bin uploaded") == ["big.bin"]
        assert (await finished(p.admin, task_id))["status"] == "COMPLETED"


async def _once(data: bytes) -> AsyncIterator[bytes]:
    yield data


@pytest.mark.slow
async def test_a_crash_is_errored_with_the_end_of_its_log(tmp_path: Path) -> None:
    async with task_platform(tmp_path) as (p, _):
        task_id = await launch(p.admin, task_body("crash", "--steps 10 --pause 1.5 --exit 3"))
        task = await finished(p.admin, task_id)
        assert task["status"] == "ERRORED", task
        error = task["healthInfo"]["error"]
        assert "exited with code 3" in error and "failing on purpose" in error, error
        assert "starting the task's process:" in error and "inference server" not in error, error
        last = (await events(p.admin, task_id))[-1]
        assert last.startswith("Changing status from 'RUNNING' to 'ERRORED' with error 'the task exited with code 3"), (
            last
        )


@pytest.mark.slow
async def test_max_runtime_stops_the_task_after_its_grace_period(tmp_path: Path) -> None:
    async with task_platform(tmp_path) as (p, cluster_id):
        body = task_body(
            "slow",
            "--sleep 60 --ignore-term",
            maxRuntimeDuration="PT2S",
            terminationGracePeriodDuration="PT1S",
        )
        task_id = await launch(p.admin, body)
        task = await finished(p.admin, task_id, timeout=30)
        assert task["status"] == "EXCEEDED_MAX_RUNTIME_DURATION", task
        await all_gone(cluster_pids(cluster_id))


@pytest.mark.slow
async def test_cancel_while_running_stops_the_process(tmp_path: Path) -> None:
    async with task_platform(tmp_path) as (p, cluster_id):
        task_id = await launch(p.admin, task_body("long", "--steps 5 --sleep 60"))

        async def running() -> list[int] | None:
            task = await get_task(p.admin, task_id)
            pids = cluster_pids(cluster_id)
            return pids if task["status"] == "RUNNING" and pids else None

        pids = await wait_for(running, timeout=30, what="the task running")
        reply = await p.admin.post(f"/v1/nvct/tasks/{task_id}/cancel")
        assert reply.status == 200 and reply.json["task"]["status"] == "CANCELED", reply.body
        await all_gone(pids)
        assert not any(alive(pid) for pid in pids)
        again = await p.admin.post(f"/v1/nvct/tasks/{task_id}/cancel")
        assert again.status == 400


@pytest.mark.slow
async def test_no_capacity_past_max_queued_duration(tmp_path: Path) -> None:
    async with task_platform(tmp_path, gpus=1) as (p, _):
        holder = await launch(p.admin, task_body("holder", "--sleep 30"))

        async def holding() -> bool:
            return (await get_task(p.admin, holder))["status"] in ("LAUNCHED", "RUNNING")

        await wait_for(holding, timeout=30, what="the first task to hold the GPU")
        starved = await launch(p.admin, task_body("starved", "--steps 100", maxQueuedDuration="PT2S"))
        task = await finished(p.admin, starved, timeout=20)
        assert task["status"] == "EXCEEDED_MAX_QUEUED_DURATION", task
        assert (await p.admin.post(f"/v1/nvct/tasks/{holder}/cancel")).status == 200


@pytest.mark.slow
async def test_a_silent_worker_is_errored_after_the_heartbeat_timeout(tmp_path: Path) -> None:
    # Six heartbeats (0.5 s apart) may go missing before the task is errored: a loaded machine delays some.
    async with task_platform(tmp_path, **{"plugins.control.tasks.heartbeat_timeout": "3"}) as (p, cluster_id):
        task_id = await launch(p.admin, task_body("quiet", "--steps 5 --sleep 60"))
        seen: list[str] = []

        async def worker_pid() -> int | None:
            task = await get_task(p.admin, task_id)
            seen.append(f"{task['status']} {task.get('healthInfo') or ''}".strip())
            if task["status"] != "RUNNING":
                return None
            return next((pid for pid in cluster_pids(cluster_id) if b"worker" in _cmdline(pid)), None)

        try:
            pid = await wait_for(worker_pid, timeout=30, what="the task running")
        except AssertionError as err:
            raise AssertionError(f"{err}; the task was {sorted(set(seen))}") from None
        os.kill(pid, signal.SIGSTOP)  # alive, but silent
        try:
            task = await finished(p.admin, task_id, timeout=20)
        finally:
            os.kill(pid, signal.SIGCONT)
        assert task["status"] == "ERRORED", task
        assert "no heartbeat" in task["healthInfo"]["error"]


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


@pytest.mark.slow
async def test_the_example_task_runs_to_completion(tmp_path: Path) -> None:
    async with task_platform(tmp_path) as (p, _):
        body = {**task_body("example", "--steps 2 --seconds 0.6"), "containerImage": "task-example"}
        task = await finished(p.admin, await launch(p.admin, body))
        assert task["status"] == "COMPLETED" and task["percentComplete"] == 100, task
        (result,) = (await p.admin.get(f"/v1/nvct/tasks/{task['id']}/results")).json["results"]
        content = await p.admin.get(f"/v1/nvct/tasks/{task['id']}/results/{result['resultId']}/content")
        assert json.loads(content.body) == {"squares": [1, 4]}


@pytest.mark.slow
async def test_secrets_reach_the_task_and_none_keeps_only_names(tmp_path: Path) -> None:
    async with task_platform(tmp_path) as (p, _):
        secrets = [{"name": "NGC_API_KEY", "value": "s3cr3t"}, {"name": "DB", "value": {"user": "u"}}]
        body = task_body("secret", "--secrets-result --steps 100", secrets=secrets)
        task = await finished(p.admin, await launch(p.admin, body))
        assert task["status"] == "COMPLETED", task
        (result,) = (await p.admin.get(f"/v1/nvct/tasks/{task['id']}/results")).json["results"]
        content = await p.admin.get(f"/v1/nvct/tasks/{task['id']}/results/{result['resultId']}/content")
        assert json.loads(content.body) == ["DB", "NGC_API_KEY"]  # the task read its secrets file
        shown = await p.admin.get(f"/v1/nvct/tasks/{task['id']}", params={"includeSecrets": "true"})
        assert sorted(shown.json["task"]["secrets"]) == ["DB", "NGC_API_KEY"] and "s3cr3t" not in shown.body.decode()

        # NONE: the result's name is kept, its content is not.
        body = task_body("names-only", "--steps 100 --results 1", resultHandlingStrategy="NONE")
        task = await finished(p.admin, await launch(p.admin, body))
        assert task["status"] == "COMPLETED", task
        (result,) = (await p.admin.get(f"/v1/nvct/tasks/{task['id']}/results")).json["results"]
        assert result["name"] == "result-0.txt"
        content = await p.admin.get(f"/v1/nvct/tasks/{task['id']}/results/{result['resultId']}/content")
        assert content.status == 404
