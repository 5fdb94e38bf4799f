"""``nvcf-mono task ...`` as users run it against a live platform (tasks stay QUEUED: no agent runs them).

The commands run in-process, in a thread beside the platform (see ``tests/e2e/cli.py``).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import anyio
import pytest

from nvcf_mono.bus.codec import TypedKV
from nvcf_mono.bus.errors import ConflictError
from nvcf_mono.contracts import buckets
from nvcf_mono.models.common import new_id, now_iso
from nvcf_mono.models.task import Task, TaskResult, TaskStatus
from nvcf_mono.structure import evolve
from nvcf_mono.testing.platform import credentials, wait_for
from tests.e2e.test_cli_control import cli, env_for, flags, kv, ok
from tests.integration.control.conftest import Platform, agent, platform

H100 = ["--gpu", "H100", "--instance-type", "ON-PREM.GPU.H100_1x"]
TASKS = "/v1/nvct/tasks"


def task_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = env_for(tmp_path, **extra)
    if "NVCF_NVCT_API_KEY" not in extra:
        env.pop("NVCF_NVCT_API_KEY", None)  # the developer's own task key must not leak in
    return env


def failed(result: subprocess.CompletedProcess[str], code: int) -> str:
    assert result.returncode == code, f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return result.stderr


async def launch(p: Platform, env: dict[str, str], *extra: str) -> str:
    created = kv(
        ok(await cli("task", "create", "--name", "train", "--image", "img:1", *H100, *extra, *flags(p), env=env))
    )
    assert created["status"] == "QUEUED"
    return created["task id"]


async def set_task(p: Platform, task_id: str, **changes: Any) -> None:
    """Move a task as the runtime would (written straight to its bucket, retried should a scheduler write too)."""
    kv_tasks = TypedKV(p.bus.kv(buckets.TASKS.name), buckets.TASK)
    for _ in range(20):
        stored = await kv_tasks.get(task_id)
        assert stored is not None
        task: Task = evolve(stored.value, last_updated_at=now_iso(), **changes)
        try:
            await kv_tasks.update(task_id, task, revision=stored.revision)
            return
        except ConflictError:
            continue
    raise AssertionError(f"could not update task {task_id}")


async def test_task_commands(tmp_path: Path) -> None:
    env = task_env(tmp_path)
    async with platform(tmp_path) as p, agent(p.bus):
        conn = flags(p)
        task_id = await launch(
            p, env, "--args=--epochs 3", "--env", "A=1", "B=x=y", "--secret", "S1=hush", "--max-runtime", "PT2H",
            "--result-handling", "none", "--tags", "a,b", "--description", "a run",
        )  # fmt: skip
        stored = (await p.admin.get(f"{TASKS}/{task_id}", params={"includeSecrets": "true"})).json["task"]
        assert stored["containerArgs"] == "--epochs 3"
        assert stored["containerEnvironment"] == [{"key": "A", "value": "1"}, {"key": "B", "value": "x=y"}]
        assert stored["secrets"] == ["S1"] and stored["resultHandlingStrategy"] == "NONE"
        assert stored["maxRuntimeDuration"] == "PT2H" and stored["terminationGracePeriodDuration"] == "PT1H"
        assert stored["tags"] == ["a", "b"] and stored["description"] == "a run"
        second = await launch(p, env)

        listed = ok(await cli("task", "list", *conn, env=env))
        header, *rows = listed.splitlines()
        assert header.split() == ["TASK", "ID", "NAME", "STATUS", "PROGRESS", "INSTANCE", "TYPE", "CREATED"]
        assert [row.split()[0] for row in rows] == [task_id, second]
        paged = await cli("task", "list", "--limit", "1", *conn, env=env)
        assert [row.split()[0] for row in ok(paged).splitlines()[1:]] == [task_id]
        assert "more tasks: add --cursor " in paged.stderr
        cursor = paged.stderr.split("--cursor ", 1)[1].split()[0]
        nxt = json.loads(ok(await cli("task", "list", "--limit", "1", "--cursor", cursor, "--json", *conn, env=env)))
        assert [t["id"] for t in nxt["tasks"]] == [second] and "cursor" not in nxt
        everything = json.loads(ok(await cli("task", "list", "--limit", "1", "--all", "--json", *conn, env=env)))
        assert [t["id"] for t in everything["tasks"]] == [task_id, second]
        assert ok(await cli("task", "list", "--status", "canceled", *conn, env=env)).strip() == "no tasks"
        assert failed(await cli("task", "list", "--limit", "0", *conn, env=env), 2)

        shown = kv(ok(await cli("task", "get", task_id, *conn, env=env)))
        assert shown["status"] == "QUEUED" and shown["image"] == "img:1"
        assert shown["gpu"] == "H100 ON-PREM.GPU.H100_1x" and shown["container env"] == "A=1, B=x=y"
        assert shown["max runtime"] == "PT2H" and shown["result handling"] == "NONE"
        assert "secrets" not in shown
        assert kv(ok(await cli("task", "get", task_id, "--include-secrets", *conn, env=env)))["secrets"] == "S1"
        assert "hush" not in ok(await cli("task", "get", task_id, "--include-secrets", "--json", *conn, env=env))

        events = ok(await cli("task", "events", task_id, *conn, env=env))
        assert "Task created with status 'QUEUED'" in events
        no_instance = await cli("task", "logs", task_id, *conn, env=env)
        assert failed(no_instance, 1).strip() == f"nvcf-mono: task {task_id} has no instance yet (status QUEUED)"

        canceled = ok(await cli("task", "cancel", task_id, *conn, env=env))
        assert canceled.strip() == f"canceled task {task_id}; status CANCELED"
        again = await cli("task", "cancel", task_id, *conn, env=env)
        assert failed(again, 1).startswith("nvcf-mono: HTTP 400: ") and "already CANCELED" in again.stderr
        as_json = json.loads(ok(await cli("task", "events", task_id, "--json", *conn, env=env)))
        assert [e["message"] for e in as_json["events"]] == [
            "Task created with status 'QUEUED'",
            "Changing status from 'QUEUED' to 'CANCELED'",
        ]

        deleted = ok(await cli("task", "delete", task_id, *conn, env=env))
        assert deleted.strip() == f"deleted task {task_id}"
        gone = await cli("task", "get", task_id, *conn, env=env)
        assert failed(gone, 1).startswith("nvcf-mono: HTTP 404: ") and gone.stdout == ""
        assert failed(await cli("task", "delete", task_id, *conn, env=env), 1).startswith("nvcf-mono: HTTP 404: ")


async def test_results_are_listed_and_downloaded(tmp_path: Path) -> None:
    env = task_env(tmp_path)
    async with platform(tmp_path) as p, agent(p.bus):
        conn = flags(p)
        task_id = await launch(p, env)
        assert ok(await cli("task", "results", task_id, *conn, env=env)).strip() == "no results"
        content = b"\x00weights\xff" * 100_000
        for name, data, stamp in (
            ("out/model.bin", content, "2030-01-01T00:00:00.001Z"),
            ("metrics", None, "2030-01-01T00:00:00.002Z"),
            ("../model.bin", b"second", "2030-01-01T00:00:00.003Z"),
        ):
            await put_result(p, task_id, name, data, stamp)
        into = tmp_path / "downloads"
        listed = await cli("task", "results", task_id, "--download", str(into), *conn, env=env)
        rows = ok(listed).splitlines()
        assert rows[0].split() == ["RESULT", "ID", "NAME", "SIZE", "CREATED", "METADATA"]
        assert [row.split()[1] for row in rows[1:]] == ["out/model.bin", "metrics", "../model.bin"]
        assert (into / "model.bin").read_bytes() == content
        [renamed] = [f for f in into.iterdir() if f.name.endswith("-model.bin")]
        assert renamed.read_bytes() == b"second"
        assert len(list(into.iterdir())) == 2  # nothing for the metadata-only result, no partial files
        assert "has no stored content" in listed.stderr and f"saved {into / 'model.bin'}" in listed.stderr


async def put_result(p: Platform, task_id: str, name: str, content: bytes | None, created_at: str) -> None:
    result_id = new_id()
    object_name = None
    if content is not None:
        object_name = buckets.task_result_object(task_id, result_id)
        await p.bus.objects(buckets.TASK_RESULT_CONTENT.name).put(object_name, content)
    result = TaskResult(
        result_id=result_id,
        task_id=task_id,
        nca_id="nvcf-default",
        name=name,
        created_at=created_at,
        size=None if content is None else len(content),
        object_name=object_name,
    )
    await TypedKV(p.bus.kv(buckets.TASK_RESULTS.name), buckets.TASK_RESULT).put(f"{task_id}.{result_id}", result)


async def test_create_from_a_file_errors_and_credentials(tmp_path: Path) -> None:
    async with platform(tmp_path) as p, agent(p.bus):
        url = p.host.endpoints.url
        creds = credentials(p.host)
        env = task_env(tmp_path, NVCF_API_URL=url, NVCF_NVCT_API_KEY=creds["task_api_key"])
        body = tmp_path / "task.json"
        body.write_text(
            json.dumps(
                {
                    "name": "fromfile",
                    "containerImage": "img:1",
                    "gpuSpecification": {"gpu": "H100", "instanceType": "ON-PREM.GPU.H100_1x", "backend": "local"},
                    "resultHandlingStrategy": "NONE",
                    "secrets": [{"name": "K", "value": "1"}],
                }
            )
        )
        # The task key from the environment is enough; flags override the file's fields.
        doc = json.loads(
            ok(
                await cli(
                    "task",
                    "create",
                    "--input-file",
                    str(body),
                    "--name",
                    "override",
                    "--secret",
                    "L=2",
                    "--json",
                    env=env,
                )
            )
        )
        task = doc["task"]
        assert task["name"] == "override" and task["secrets"] == ["K", "L"]
        assert task["gpuSpecification"]["backend"] == "local" and task["resultHandlingStrategy"] == "NONE"
        moved = json.loads(
            ok(await cli("task", "create", "--input-file", str(body), "--clusters", "local", "--json", env=env))
        )
        assert moved["task"]["gpuSpecification"] == {
            "gpu": "H100",
            "instanceType": "ON-PREM.GPU.H100_1x",
            "clusters": ["local"],
        }

        missing = await cli("task", "create", "--name", "x", env=env)
        assert failed(missing, 2).strip() == (
            "nvcf-mono: task create: --gpu, --instance-type, --image required (as flags or in --input-file)"
        )
        bad = tmp_path / "bad.json"
        bad.write_text("[1]")
        assert failed(await cli("task", "create", "--input-file", str(bad), env=env), 2).strip() == (
            f"nvcf-mono: --input-file {bad}: expected a JSON object, got list"
        )
        unknown_gpu = await cli(
            "task", "create", "--name", "x", "--image", "i", "--gpu", "B200", "--instance-type", "T", env=env
        )
        assert failed(unknown_gpu, 1).strip() == "nvcf-mono: HTTP 400: Invalid GPU 'B200' specified"

        # A function key lacks the task scopes: the error says what task commands need.
        function_key = task_env(tmp_path, NVCF_API_URL=url, NVCF_API_KEY=creds["api_key"])
        refused = await cli("task", "list", env=function_key)
        assert failed(refused, 1).startswith("nvcf-mono: HTTP 403: ")
        assert "NVCF_NVCT_API_KEY" in refused.stderr


@pytest.mark.slow
async def test_wait_follows_the_task_to_its_end(tmp_path: Path) -> None:
    env = task_env(tmp_path)
    async with platform(tmp_path) as p, agent(p.bus):
        conn = flags(p)
        waited = await cli(
            "task", "create", "--name", "slow", "--image", "i", *H100, "--wait", "--timeout", "1", *conn, env=env
        )
        assert "timed out after 1s waiting for task" in failed(waited, 1) and "QUEUED" in waited.stderr

        async def first_queued() -> str | None:
            tasks = (await p.admin.get(TASKS, params={"status": "QUEUED", "limit": "100"})).json["tasks"]
            fresh = [t["id"] for t in tasks if t["name"] == "job"]
            return fresh[0] if fresh else None

        async def complete_it() -> None:
            task_id = await wait_for(first_queued, timeout=30, what="the task")
            await anyio.sleep(1.5)
            await set_task(p, task_id, status=TaskStatus.RUNNING, percent_complete=40)
            await anyio.sleep(1.5)
            await set_task(p, task_id, status=TaskStatus.COMPLETED, percent_complete=100)

        result: dict[str, subprocess.CompletedProcess[str]] = {}

        async def run_it(*args: str) -> None:
            result["run"] = await cli("task", "create", "--name", "job", "--image", "i", *H100, *args, *conn, env=env)

        async with anyio.create_task_group() as tg:
            tg.start_soon(run_it, "--wait", "--timeout", "60")
            tg.start_soon(complete_it)
        done = result["run"]
        assert kv(ok(done))["status"] == "COMPLETED"
        progress = [line.split("] ", 1)[1] for line in done.stderr.splitlines() if line.startswith("[")]
        assert progress == ["QUEUED", "RUNNING 40%", "COMPLETED 100%"]

        async def fail_it() -> None:
            task_id = await wait_for(first_queued, timeout=30, what="the task")
            await set_task(p, task_id, status=TaskStatus.ERRORED)

        async with anyio.create_task_group() as tg:
            tg.start_soon(run_it, "--wait", "--json")
            tg.start_soon(fail_it)
        errored = result["run"]
        assert failed(errored, 1).splitlines()[-1].startswith("nvcf-mono: task ")
        assert errored.stderr.splitlines()[-1].endswith(" ended ERRORED")
        assert json.loads(errored.stdout)["task"]["status"] == "ERRORED"
