"""Tasks (NVCT) over HTTP without an agent that runs them: tasks stay QUEUED unless canceled.

Launch with NVCT's defaults and checks, pages of tasks and events, bulk reads, cancel, delete with
everything a task leaves behind, secrets, results and their content, accounts, scopes and key resources.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Collection
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import attrs
import pytest
from grpclib.client import Channel
from grpclib.const import Status
from grpclib.exceptions import GRPCError

from nvcf_mono.auth.keystore import API_KEY_STORE
from nvcf_mono.auth.scopes import TASK_KEY_SCOPES
from nvcf_mono.auth.secret import KEYRING
from nvcf_mono.auth.tokens import TokenSigner, mint_worker_token
from nvcf_mono.bus.codec import TypedKV
from nvcf_mono.contracts import buckets, rpc, subjects
from nvcf_mono.contracts.messages import TaskRoomCall, TaskRoomReply
from nvcf_mono.models.account import DEFAULT_ACCOUNT
from nvcf_mono.models.api_key import TASKS_SERVICE_ID, Authorizations, KeyResource, Policy, Product
from nvcf_mono.models.common import new_id, now_iso
from nvcf_mono.models.task import Task, TaskResult
from nvcf_mono.planes.control.tasks.views import BOOKKEEPING, TaskDto
from nvcf_mono.proto.gen.nvcf.worker.v1 import TaskResultAck, TaskResultChunk, WorkerServiceStub
from nvcf_mono.testing.platform import Api, Reply, wait_for

from .conftest import Platform, agent, platform

TASKS = "/v1/nvct/tasks"
GPU = {"gpu": "H100", "instanceType": "ON-PREM.GPU.H100_1x"}
TASK = {"name": "train-1", "containerImage": "registry.example.com/train:1", "gpuSpecification": GPU}
SECRET_VALUES = ("first-SECRET-0001", "second-SECRET-0002", "third-SECRET-0003")
ACCOUNT_TASKS = (KeyResource(id="*", type="account-tasks"),)


def assert_problem(reply: Reply, status: int, *fragments: str) -> None:
    assert reply.status == status, (reply.status, reply.body)
    assert reply.headers["Content-Type"].startswith("application/problem+json"), reply.headers
    doc = reply.json
    assert doc["status"] == status and doc["type"].startswith("urn:nv-boot:problem-details:")
    for fragment in fragments:
        assert fragment.lower() in doc["detail"].lower(), (fragment, doc["detail"])


def no_secret_values(reply: Reply) -> None:
    for value in SECRET_VALUES:
        assert value.encode() not in reply.body, f"secret value leaked: {reply.body[:300]!r}"


async def launch(api: Api, **fields: Any) -> dict[str, Any]:
    reply = await api.post(TASKS, {**TASK, **fields})
    assert reply.status == 200, reply.body
    task: dict[str, Any] = reply.json["task"]
    return task


async def task_key(
    p: Platform,
    *,
    nca_id: str = "nvcf-default",
    scopes: Collection[str] = TASK_KEY_SCOPES,
    resources: tuple[KeyResource, ...] = ACCOUNT_TASKS,
) -> Api:
    """An API key of ``nca_id`` with task scopes over some tasks (minted in the key store itself)."""
    _, value = await p.host.services.get(API_KEY_STORE).create(
        nca_id=nca_id,
        owner_id="task-tests",
        description="task key",
        authorizations=Authorizations(
            policies=(
                Policy(
                    scopes=tuple(sorted(scopes)),
                    resources=resources,
                    product=Product.TASKS,
                    aud=TASKS_SERVICE_ID,
                    auds=(TASKS_SERVICE_ID,),
                ),
            )
        ),
        expires_in=timedelta(hours=1),
        issuer_service_id=TASKS_SERVICE_ID,
        audience_service_ids=(TASKS_SERVICE_ID,),
    )
    return p.api(value)


async def all_pages(api: Api, path: str, items: str, **params: str) -> list[dict[str, Any]]:
    """Every item of a paginated listing, following cursors; the last page must carry none."""
    out: list[dict[str, Any]] = []
    cursor: str | None = None
    for _ in range(1000):
        query = dict(params) | ({"cursor": cursor} if cursor else {})
        reply = await api.get(path, params=query)
        assert reply.status == 200, reply.body
        out += reply.json[items]
        cursor = reply.json.get("cursor")
        if cursor is None:
            return out
        assert reply.json[items], "a page with a cursor must not be empty"
    raise AssertionError("pagination did not end")


async def event_messages(api: Api, task_id: str) -> list[str]:
    return [e["message"] for e in await all_pages(api, f"{TASKS}/{task_id}/events", "events")]


def test_the_view_shows_every_task_field_but_the_bookkeeping() -> None:
    stored = {f.name for f in attrs.fields(Task)}
    shown = {f.name for f in attrs.fields(TaskDto)}
    assert shown == stored - BOOKKEEPING
    assert stored >= BOOKKEEPING


async def test_launch_fills_nvct_defaults_and_writes_the_first_event(tmp_path: Path) -> None:
    async with platform(tmp_path) as p, agent(p.bus):
        reply = await p.task_key.post(
            TASKS,
            {
                **TASK,
                "gpuSpecification": {"gpu": "h100", "instanceType": "on-prem.gpu.h100_1x"},
                "containerArgs": "--epochs 3",
                "containerEnvironment": [{"key": "MODE", "value": "fast"}],
                "tags": ["nightly"],
                "description": "a training run",
                "resultsLocation": "my-org/my-team/model",
                "someFutureField": True,  # unknown fields are ignored
            },
        )
        assert reply.status == 200, reply.body
        task = reply.json["task"]
        assert task["status"] == "QUEUED" and task["ncaId"] == "nvcf-default" and task["name"] == "train-1"
        assert task["maxQueuedDuration"] == "PT72H"
        assert task["terminationGracePeriodDuration"] == "PT1H"
        assert task["resultHandlingStrategy"] == "UPLOAD"
        assert task["resultsLocation"] == "my-org/my-team/model"
        assert task["gpuSpecification"] == {"gpu": "H100", "instanceType": "ON-PREM.GPU.H100_1x"}  # as registered
        assert task["percentComplete"] == 0 and task["instances"] == []
        assert task["createdAt"] == task["lastUpdatedAt"]
        assert "maxRuntimeDuration" not in task and "secrets" not in task and "healthInfo" not in task
        for camel in ("requestId", "clusterId", "placedAt", "events", "terminating", "progressName", "finishedAt"):
            assert camel not in task, camel

        got = await p.task_key.get(f"{TASKS}/{task['id']}")
        assert got.status == 200
        # What a scheduler may have changed meanwhile (placing it) aside, the task reads as it was created.
        placement = {"lastUpdatedAt", "instances"}
        assert {k: v for k, v in got.json["task"].items() if k not in placement} == {
            k: v for k, v in task.items() if k not in placement
        }
        [event] = (await p.task_key.get(f"{TASKS}/{task['id']}/events")).json["events"]
        assert event["message"] == "Task created with status 'QUEUED'"
        assert event["taskId"] == task["id"] and event["ncaId"] == "nvcf-default" and event["eventId"]

        # A runtime shorter than the default grace period is the grace period; given values are kept.
        short = await launch(p.admin, maxRuntimeDuration="PT10M")
        assert short["terminationGracePeriodDuration"] == "PT10M" and short["maxRuntimeDuration"] == "PT10M"
        given = await launch(
            p.admin,
            maxRuntimeDuration="PT2H",
            maxQueuedDuration="PT5M",
            terminationGracePeriodDuration="PT30M",
            resultHandlingStrategy="none",
        )
        assert given["maxQueuedDuration"] == "PT5M" and given["terminationGracePeriodDuration"] == "PT30M"
        assert given["resultHandlingStrategy"] == "NONE"


async def test_launch_validation(tmp_path: Path) -> None:
    async with platform(tmp_path) as p:
        assert_problem(await p.admin.post(TASKS, TASK), 400, "no cluster agent has registered yet")
        async with agent(p.bus):
            chart = "https://helm.example.com/org/charts/train-1.0.0.tgz"
            no_image = {k: v for k, v in TASK.items() if k != "containerImage"}
            cases: list[tuple[dict[str, Any], tuple[str, ...]]] = [
                ({**TASK, "helmChart": chart}, ("Cannot specify both 'containerImage' and 'helmChart'",)),
                (no_image, ("'containerImage' or 'helmChart' must be specified",)),
                ({**no_image, "helmChart": chart}, ("Helm tasks need a cluster whose agent installs Helm charts",)),
                ({**TASK, "maxRuntimeDuration": "10 minutes"}, ("field=maxRuntimeDuration", "ISO-8601")),
                ({**TASK, "maxQueuedDuration": "P1W"}, ("field=maxQueuedDuration",)),
                ({**TASK, "maxRuntimeDuration": "PT0S"}, ("'maxRuntimeDuration' must be longer than zero",)),
                ({**TASK, "terminationGracePeriodDuration": "P0D"}, ("'terminationGracePeriodDuration' must be",)),
                (
                    {**TASK, "maxRuntimeDuration": "PT1H", "terminationGracePeriodDuration": "PT2H"},
                    ("'terminationGracePeriodDuration' (PT2H) must be less than or equal to 'maxRuntimeDuration'",),
                ),
                ({**TASK, "models": [{"name": "m", "version": "1", "uri": "u"}]}, ("'models' is not supported",)),
                ({**TASK, "resources": []}, ("'resources' is not supported",)),
                ({**TASK, "telemetries": {}}, ("Telemetry object must have at least one UUID specified",)),
                ({**TASK, "gpuSpecification": {**GPU, "gpu": "B200"}}, ("Invalid GPU 'B200' specified",)),
                (
                    {**TASK, "gpuSpecification": {**GPU, "instanceType": "ON-PREM.GPU.H100_3x"}},
                    ("Invalid InstanceType 'ON-PREM.GPU.H100_3x' specified",),
                ),
                ({**TASK, "gpuSpecification": {**GPU, "backend": "nowhere"}}, ("Invalid Backend 'nowhere'",)),
                (
                    {**TASK, "gpuSpecification": {**GPU, "backend": "local", "clusters": ["local"]}},
                    ("Cannot specify both 'backend' and 'clusters'",),
                ),
                ({**TASK, "gpuSpecification": {"gpu": "H100"}}, ("field=gpuSpecification.instanceType",)),
                ({**TASK, "name": "bad name!"}, ("field=name",)),
                ({**TASK, "resultHandlingStrategy": "SOMETIMES"}, ("field=resultHandlingStrategy",)),
                ({**TASK, "containerEnvironment": [{"key": "NVCT_TASK_ID", "value": "x"}]}, ("reserved",)),
                (
                    {**TASK, "secrets": [{"name": "a", "value": "1"}, {"name": "a", "value": "2"}]},
                    ("duplicate secret name 'a'",),
                ),
                ({**TASK, "gpuSpecification": {**GPU, "backend": "GFN"}}, ("Invalid Backend 'GFN'",)),
            ]
            for body, fragments in cases:
                assert_problem(await p.admin.post(TASKS, body), 400, *fragments)
            missing = {**TASK, "telemetries": {"logsTelemetryId": new_id()}}  # not an endpoint of the account
            assert_problem(await p.admin.post(TASKS, missing), 404, "Telemetry", "Not found")
            assert_problem(await p.admin.post(TASKS, data=b"[1]", headers={"Content-Type": "application/json"}), 400)
            # Nothing was stored by the refused requests.
            assert (await p.admin.get(TASKS)).json["tasks"] == []


@pytest.mark.slow
async def test_pages_return_every_task_once_in_creation_order(tmp_path: Path) -> None:
    async with platform(tmp_path) as p, agent(p.bus):
        raised = await p.admin.patch(f"/v2/nvcf/accounts/{DEFAULT_ACCOUNT}", {"maxTasksAllowed": 250})
        assert raised.status == 200, raised.body
        created: list[str] = []

        async def launch_some(count: int) -> None:
            for _ in range(count):
                created.append((await launch(p.task_key))["id"])

        async with anyio.create_task_group() as tg:
            for _ in range(10):
                tg.start_soon(launch_some, 25)
        assert len(created) == 250

        first = await p.task_key.get(TASKS)
        assert first.status == 200
        assert len(first.json["tasks"]) == 10 and first.json["limit"] == 10 and first.json["cursor"]
        for limit in ("50", "100", "7"):
            listed = await all_pages(p.task_key, TASKS, "tasks", limit=limit)
            ids = [t["id"] for t in listed]
            assert len(ids) == 250 and set(ids) == set(created), limit
            keys = [(t["createdAt"], t["id"]) for t in listed]
            assert keys == sorted(keys)
        # The fifth page of 50 ends exactly at the last task: it carries no cursor.
        cursor = None
        for number in range(1, 6):
            page = await p.task_key.get(TASKS, params={"limit": "50"} | ({"cursor": cursor} if cursor else {}))
            assert len(page.json["tasks"]) == 50
            cursor = page.json.get("cursor")
            assert (cursor is None) == (number == 5)

        for bad in ("not-a-cursor", "e30", "WyJhIl0", "%%%"):
            assert_problem(await p.task_key.get(TASKS, params={"cursor": bad}), 400, "invalid cursor")
        for limit in ("0", "101", "ten"):
            assert_problem(await p.task_key.get(TASKS, params={"limit": limit}), 400, "limit")

        canceled = created[:3]
        for task_id in canceled:
            assert (await p.task_key.post(f"{TASKS}/{task_id}/cancel")).status == 200
        only = await all_pages(p.task_key, TASKS, "tasks", status="canceled", limit="2")
        assert sorted(t["id"] for t in only) == sorted(canceled)
        assert all(t["status"] == "CANCELED" for t in only)
        queued = await all_pages(p.task_key, TASKS, "tasks", status="QUEUED", limit="100")
        assert len(queued) == 247
        both = await all_pages(p.task_key, TASKS, "tasks", status="queued,Canceled", limit="100")
        assert len(both) == 250
        assert_problem(await p.task_key.get(TASKS, params={"status": "SLEEPING"}), 400, "unknown task status")


async def test_bulk_read_leaves_out_what_the_caller_cannot_see(tmp_path: Path) -> None:
    async with platform(tmp_path) as p, agent(p.bus):
        one, two = await launch(p.task_key), await launch(p.task_key, name="second")
        reply = await p.task_key.post(
            f"{TASKS}/bulk", {"taskIds": [two["id"], new_id(), "not-a-uuid", one["id"], two["id"]]}
        )
        assert reply.status == 200, reply.body
        assert reply.json == {
            "ncaId": "nvcf-default",
            "tasks": [
                {"id": two["id"], "name": "second", "status": "QUEUED"},
                {"id": one["id"], "name": "train-1", "status": "QUEUED"},
            ],
        }
        assert (await p.task_key.post(f"{TASKS}/bulk", {"taskIds": []})).json == {"ncaId": "nvcf-default", "tasks": []}
        assert_problem(await p.task_key.post(f"{TASKS}/bulk", {}), 400, "field=taskIds")
        assert_problem(await p.task_key.post(f"{TASKS}/bulk", {"taskIds": [new_id()] * 101}), 400, "taskIds")


async def test_cancel_once_with_its_event(tmp_path: Path) -> None:
    async with platform(tmp_path) as p, agent(p.bus):
        task = await launch(p.task_key)
        url = f"{TASKS}/{task['id']}"
        canceled = await p.task_key.post(f"{url}/cancel")
        assert canceled.status == 200, canceled.body
        assert canceled.json["task"]["status"] == "CANCELED"
        assert canceled.json["task"]["lastUpdatedAt"] >= task["lastUpdatedAt"]
        assert (await p.task_key.get(url)).json["task"]["status"] == "CANCELED"
        assert await event_messages(p.task_key, task["id"]) == [
            "Task created with status 'QUEUED'",
            "Changing status from 'QUEUED' to 'CANCELED'",
        ]
        # Events page one at a time, in order.
        first = await p.task_key.get(f"{url}/events", params={"limit": "1"})
        assert first.json["limit"] == 1 and len(first.json["events"]) == 1 and first.json["cursor"]
        second = await p.task_key.get(f"{url}/events", params={"limit": "1", "cursor": first.json["cursor"]})
        assert [e["message"] for e in second.json["events"]] == ["Changing status from 'QUEUED' to 'CANCELED'"]
        assert "cursor" not in second.json
        assert_problem(await p.task_key.get(f"{url}/events", params={"cursor": "junk"}), 400, "invalid cursor")

        assert_problem(await p.task_key.post(f"{url}/cancel"), 400, "already CANCELED")
        assert len(await event_messages(p.task_key, task["id"])) == 2
        assert_problem(await p.task_key.post(f"{TASKS}/{new_id()}/cancel"), 404, "not found")
        assert_problem(await p.task_key.post(f"{TASKS}/nope/cancel"), 404, "not found")


async def test_delete_purges_the_task_and_everything_it_left(tmp_path: Path) -> None:
    async with platform(tmp_path) as p, agent(p.bus):
        task = await launch(p.task_key, secrets=[{"name": "token", "value": SECRET_VALUES[0]}])
        task_id = task["id"]
        await put_result(p, task_id, b"weights")
        kept = await launch(p.task_key, secrets=[{"name": "token", "value": SECRET_VALUES[1]}])
        await put_result(p, kept["id"], b"other")

        deleted = await p.task_key.delete(f"{TASKS}/{task_id}")
        assert deleted.status == 204 and deleted.body == b""
        assert_problem(await p.task_key.get(f"{TASKS}/{task_id}"), 404, task_id)
        assert_problem(await p.task_key.get(f"{TASKS}/{task_id}/events"), 404)
        assert_problem(await p.task_key.get(f"{TASKS}/{task_id}/results"), 404)
        assert_problem(await p.task_key.delete(f"{TASKS}/{task_id}"), 404)
        pattern = buckets.task_item_pattern(task_id)
        assert await p.bus.kv(buckets.TASK_EVENTS.name).keys(pattern) == []
        assert await p.bus.kv(buckets.TASK_RESULTS.name).keys(pattern) == []
        assert await p.bus.kv(buckets.SECRETS.name).get(buckets.task_secrets_key(task_id)) is None
        assert await p.bus.kv(buckets.TASKS.name).get(task_id) is None
        names = [o.name for o in await p.bus.objects(buckets.TASK_RESULT_CONTENT.name).list()]
        assert not any(n.startswith(task_id) for n in names) and any(n.startswith(kept["id"]) for n in names)
        # The other task is untouched.
        assert len(await event_messages(p.task_key, kept["id"])) == 1
        assert await p.bus.kv(buckets.SECRETS.name).get(buckets.task_secrets_key(kept["id"])) is not None


async def test_secrets_are_named_never_shown_and_updated_by_merge(tmp_path: Path) -> None:
    async with platform(tmp_path) as p, agent(p.bus):
        created = await p.task_key.post(
            TASKS, {**TASK, "secrets": [{"name": "b", "value": SECRET_VALUES[0]}, {"name": "a", "value": {"k": 1}}]}
        )
        assert created.status == 200
        no_secret_values(created)
        task = created.json["task"]
        assert task["secrets"] == ["a", "b"]
        url = f"{TASKS}/{task['id']}"
        plain = await p.task_key.get(url)
        assert "secrets" not in plain.json["task"]
        listed = await p.task_key.get(TASKS)
        assert all("secrets" not in t for t in listed.json["tasks"])

        put = await p.task_key.put(
            f"/v1/nvct/secrets/tasks/{task['id']}",
            {"secrets": [{"name": "b", "value": SECRET_VALUES[1]}, {"name": "c", "value": SECRET_VALUES[2]}]},
        )
        assert put.status == 204 and put.body == b""
        detailed = await p.task_key.get(url, params={"includeSecrets": "true"})
        assert detailed.json["task"]["secrets"] == ["a", "b", "c"]
        for reply in (plain, listed, detailed, await p.task_key.get(url), await p.task_key.get(f"{url}/events")):
            no_secret_values(reply)
        sealed = await p.bus.kv(buckets.SECRETS.name).get(buckets.task_secrets_key(task["id"]))
        assert sealed is not None
        assert json.loads(sealed.value)["data"]["names"] == ["a", "b", "c"]
        for value in SECRET_VALUES:
            assert value.encode() not in sealed.value

        secrets_url = f"/v1/nvct/secrets/tasks/{task['id']}"
        dup = {"secrets": [{"name": "x", "value": "1"}, {"name": "x", "value": "2"}]}
        assert_problem(await p.task_key.put(secrets_url, dup), 400, "duplicate secret name 'x'")
        assert_problem(await p.task_key.put(secrets_url, {"secrets": []}), 400, "at least one")
        assert_problem(await p.task_key.put(secrets_url, {}), 400, "field=secrets")
        bad_name = {"secrets": [{"name": "bad name", "value": "1"}]}
        assert_problem(await p.task_key.put(secrets_url, bad_name), 400, "invalid secret name")

        bare = await launch(p.task_key)
        one = {"secrets": [{"name": "a", "value": "1"}]}
        assert_problem(await p.task_key.put(f"/v1/nvct/secrets/tasks/{bare['id']}", one), 400, "without secrets")
        assert (await p.task_key.post(f"{url}/cancel")).status == 200
        assert_problem(await p.task_key.put(secrets_url, one), 400, "CANCELED")
        assert_problem(await p.task_key.put(f"/v1/nvct/secrets/tasks/{new_id()}", one), 404)


async def put_result(
    p: Platform, task_id: str, content: bytes | None, *, name: str = "model.bin", created_at: str | None = None
) -> str:
    """A result as the worker's sidecar stores one (content None: metadata only)."""
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
        created_at=created_at or now_iso(),
        metadata={"epoch": 3},
        size=None if content is None else len(content),
        object_name=object_name,
    )
    await TypedKV(p.bus.kv(buckets.TASK_RESULTS.name), buckets.TASK_RESULT).put(f"{task_id}.{result_id}", result)
    return result_id


async def test_results_are_listed_and_their_content_downloaded(tmp_path: Path) -> None:
    async with platform(tmp_path) as p, agent(p.bus):
        task = await launch(p.task_key)
        url = f"{TASKS}/{task['id']}/results"
        assert (await p.task_key.get(url)).json == {"results": [], "limit": 10}
        content = bytes(range(256)) * 4096  # 1 MiB, several chunks
        # Stored out of order: results list by creation time.
        second = await put_result(p, task["id"], None, name="metrics", created_at="2030-01-01T00:00:00.002Z")
        first = await put_result(p, task["id"], content, name="dir/model.bin", created_at="2030-01-01T00:00:00.001Z")
        results = await all_pages(p.task_key, url, "results", limit="1")
        assert [r["resultId"] for r in results] == [first, second]
        assert results[0] == {
            "resultId": first,
            "taskId": task["id"],
            "ncaId": "nvcf-default",
            "name": "dir/model.bin",
            "createdAt": results[0]["createdAt"],
            "metadata": {"epoch": 3},
            "size": len(content),
        }
        assert "size" not in results[1]

        got = await p.task_key.get(f"{url}/{first}/content")
        assert got.status == 200 and got.body == content
        assert got.headers["Content-Type"] == "application/octet-stream"
        assert got.headers["Content-Disposition"] == 'attachment; filename="model.bin"'
        head = await p.task_key.call("HEAD", f"{url}/{first}/content")  # the download's head, nothing read
        assert head.status == 200 and head.body == b"" and head.headers["Content-Length"] == str(len(content))
        assert head.headers["Content-Disposition"] == got.headers["Content-Disposition"]
        assert_problem(await p.task_key.get(f"{url}/{second}/content"), 404, "no stored content")
        assert (await p.task_key.call("HEAD", f"{url}/{second}/content")).status == 404
        assert_problem(await p.task_key.get(f"{url}/{new_id()}/content"), 404, "not found")
        assert_problem(await p.task_key.get(f"{url}/a.b/content"), 404, "not found")

        metadata_only = await launch(p.task_key, resultHandlingStrategy="NONE")
        none_id = await put_result(p, metadata_only["id"], None)
        none_url = f"{TASKS}/{metadata_only['id']}/results"
        assert [r["resultId"] for r in (await p.task_key.get(none_url)).json["results"]] == [none_id]
        assert_problem(await p.task_key.get(f"{none_url}/{none_id}/content"), 404, "resultHandlingStrategy is NONE")
        # Content a worker sends anyway for such a task (one not to be trusted) finds no room at all.
        room = await rpc.call(
            p.bus, subjects.task_subject("room"), TaskRoomCall(task_id=metadata_only["id"]), TaskRoomReply, timeout=5
        )
        assert room.max_bytes == 0 and "NONE" in room.why
        uploading = await rpc.call(
            p.bus, subjects.task_subject("room"), TaskRoomCall(task_id=task["id"]), TaskRoomReply, timeout=5
        )
        assert uploading.max_bytes > 0


async def test_tasks_belong_to_their_account(tmp_path: Path) -> None:
    async with platform(tmp_path) as p, agent(p.bus):
        assert (await p.admin.post("/v2/nvcf/accounts/team-a", {"name": "Team A"})).status == 200
        team = await task_key(p, nca_id="team-a")
        theirs = await launch(team, name="theirs")
        assert theirs["ncaId"] == "team-a"
        mine = await launch(p.task_key, name="mine")

        url = f"{TASKS}/{theirs['id']}"
        for api in (p.task_key, p.admin):
            assert_problem(await api.get(url), 404, theirs["id"])
            assert_problem(await api.get(f"{url}/events"), 404)
            assert_problem(await api.get(f"{url}/results"), 404)
            assert_problem(await api.post(f"{url}/cancel"), 404)
            assert_problem(await api.delete(url), 404)
            assert_problem(
                await api.put(f"/v1/nvct/secrets/tasks/{theirs['id']}", {"secrets": [{"name": "a", "value": "1"}]}), 404
            )
            assert [t["id"] for t in (await api.get(TASKS)).json["tasks"]] == [mine["id"]]
            bulk = await api.post(f"{TASKS}/bulk", {"taskIds": [theirs["id"], mine["id"]]})
            assert [t["id"] for t in bulk.json["tasks"]] == [mine["id"]]
        assert [t["id"] for t in (await team.get(TASKS)).json["tasks"]] == [theirs["id"]]
        assert_problem(await team.get(f"{TASKS}/{mine['id']}"), 404)
        assert (await team.get(url)).json["task"]["status"] == "QUEUED"
        assert (await team.delete(url)).status == 204


async def test_scopes_and_key_resources(tmp_path: Path) -> None:
    async with platform(tmp_path) as p, agent(p.bus):
        task = await launch(p.task_key)
        other = await launch(p.task_key, name="other")
        url = f"{TASKS}/{task['id']}"

        assert_problem(await p.key.post(TASKS, TASK), 403, "launch_task")  # the function key
        assert_problem(await p.key.get(TASKS), 403, "list_tasks")
        no_launch = await task_key(p, scopes=TASK_KEY_SCOPES - {"launch_task"})
        assert_problem(await no_launch.post(TASKS, TASK), 403, "launch_task")
        assert (await no_launch.get(url)).status == 200
        reader = await task_key(p, scopes={"list_tasks"})
        assert (await reader.get(TASKS)).status == 200
        for method, path in (
            ("GET", url),
            ("POST", f"{url}/cancel"),
            ("DELETE", url),
            ("GET", f"{url}/events"),
            ("GET", f"{url}/results"),
            ("PUT", f"/v1/nvct/secrets/tasks/{task['id']}"),
        ):
            body = {"secrets": [{"name": "a", "value": "1"}]} if method == "PUT" else None
            assert_problem(await reader.call(method, path, body), 403, "lacks the scope")

        # A key for one task reaches that task only, and cannot launch others.
        one = await task_key(p, resources=(KeyResource(id=task["id"], type="task"),))
        assert (await one.get(url)).status == 200
        assert (await one.get(f"{url}/events")).status == 200
        assert_problem(await one.get(f"{TASKS}/{other['id']}"), 403, "does not grant access")
        assert [t["id"] for t in (await one.get(TASKS)).json["tasks"]] == [task["id"]]
        bulk = await one.post(f"{TASKS}/bulk", {"taskIds": [task["id"], other["id"]]})
        assert [t["id"] for t in bulk.json["tasks"]] == [task["id"]]
        assert_problem(await one.post(TASKS, TASK), 403, "account-tasks")
        assert (await one.post(f"{url}/cancel")).status == 200


async def test_the_openapi_document_describes_the_task_routes(tmp_path: Path) -> None:
    async with platform(tmp_path) as p:
        doc = (await p.anonymous.get("/v3/openapi")).json
        paths = doc["paths"]
        expected = {
            "/v1/nvct/tasks": {"get": ["list_tasks"], "post": ["launch_task"]},
            "/v1/nvct/tasks/bulk": {"post": ["list_tasks"]},
            "/v1/nvct/tasks/{taskId}": {"get": ["task_details"], "delete": ["delete_task"]},
            "/v1/nvct/tasks/{taskId}/cancel": {"post": ["cancel_task"]},
            "/v1/nvct/tasks/{taskId}/events": {"get": ["list_events"]},
            "/v1/nvct/tasks/{taskId}/results": {"get": ["list_results"]},
            "/v1/nvct/tasks/{taskId}/results/{resultId}/content": {"get": ["list_results"]},
            "/v1/nvct/secrets/tasks/{taskId}": {"put": ["update_secrets"]},
        }
        for path, methods in expected.items():
            for method, scopes in methods.items():
                assert paths[path][method]["x-scopes"] == scopes, (path, method)
        schema = doc["components"]["schemas"]["TaskDto"]
        assert schema["additionalProperties"] is False
        assert not {"requestId", "events", "terminating"} & set(schema["properties"])
        assert doc["components"]["schemas"]["TaskListResponse"]["additionalProperties"] is False


async def test_results_stored_at_once_share_the_accounts_result_quota(tmp_path: Path) -> None:
    """Each result's room was what the recorded results left: two stored at once on a node both got in,
    together past the quota. What an upload under way brings (its declared size first) counts for the others.
    """
    async with platform(tmp_path, **{"plugins.control.tasks.max_account_result_bytes": "4000"}) as p, agent(p.bus):
        signer = TokenSigner(p.host.services.get(KEYRING).token_key)
        tokens = []
        for n in range(3):
            task = await launch(p.task_key, name=f"results-{n}")
            tokens.append(
                mint_worker_token(
                    signer,
                    nca_id=task["ncaId"],
                    function_id="",
                    function_version_id="",
                    request_id="r",
                    task_id=task["id"],
                )
            )
        host, port = p.host.endpoints.grpc_address.rsplit(":", 1)
        release = anyio.Event()

        async def chunks(token: str, size: int, *, hold: bool = False) -> AsyncIterator[TaskResultChunk]:
            yield TaskResultChunk(worker_token=token, name="out.bin", size=size, data=b"a" * 1000)
            yield TaskResultChunk(data=b"b" * 500)
            if hold:
                await release.wait()
            yield TaskResultChunk(data=b"c" * (size - 1500))

        channel = Channel(host, int(port))
        try:
            stub = WorkerServiceStub(channel)
            async with anyio.create_task_group() as tg:
                first: list[TaskResultAck] = []

                async def held_open() -> None:
                    first.append(await stub.task_upload_result(chunks(tokens[0], 2500, hold=True), timeout=30))

                tg.start_soon(held_open)
                await wait_for(lambda: _under_way(p), timeout=10, what="the first upload under way")
                with pytest.raises(GRPCError) as refused:
                    await stub.task_upload_result(chunks(tokens[1], 2500), timeout=30)
                assert refused.value.status is Status.RESOURCE_EXHAUSTED, refused.value
                assert "other results being stored bring 2500" in str(refused.value.message)
                release.set()
            assert first and first[0].result_id
            assert (await stub.task_upload_result(chunks(tokens[2], 1500), timeout=30)).result_id  # 4000 exactly
        finally:
            channel.close()


async def _under_way(p: Platform) -> bool:
    return len(p.host.plugin("invocation").workers._tasks._uploads) > 0
