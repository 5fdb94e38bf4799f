"""``/v1/nvct/tasks``: launch run-to-completion tasks, follow their events and results, cancel, delete."""

from __future__ import annotations

from aiohttp import web

from nvcf_mono.auth import scopes as S
from nvcf_mono.contracts import buckets
from nvcf_mono.http.api import Call, Param, Routes
from nvcf_mono.http.downloads import stream_object
from nvcf_mono.models.common import max_items
from nvcf_mono.models.secret import SecretsRequest
from nvcf_mono.models.task import CreateTaskRequest, Task, TaskResult
from nvcf_mono.planes.control.context import Control
from nvcf_mono.planes.control.tasks import service
from nvcf_mono.planes.control.tasks.views import (
    BulkTasksResponse,
    TaskEventListResponse,
    TaskListResponse,
    TaskResponse,
    TaskResultListResponse,
    result_dto,
    task_dto,
    task_summary,
)
from nvcf_mono.structure import WireModel, checked, wire

TAG = "tasks"
routes: Routes[Control] = Routes()
TASKS = "/v1/nvct/tasks"
TASK = "/v1/nvct/tasks/{taskId}"
DEFAULT_LIMIT = 10
MAX_LIMIT = 100
_CHUNK = 256 * 1024


@wire
class BulkTasksRequest(WireModel):
    """Body of ``POST /v1/nvct/tasks/bulk``."""

    task_ids: tuple[str, ...] = checked(check=max_items(MAX_LIMIT))


def page_params(what: str) -> tuple[Param, ...]:
    return (
        Param(
            name="limit",
            description=f"{what} per page (default {DEFAULT_LIMIT}).",
            schema={"type": "integer", "minimum": 1, "maximum": MAX_LIMIT},
        ),
        Param(name="cursor", description="The cursor of the previous page; none for the first page."),
    )


def limit_of(call: Call[None]) -> int:
    return call.query_int("limit", DEFAULT_LIMIT, lo=1, hi=MAX_LIMIT)


async def find(ctl: Control, call: Call[None]) -> Task:
    return await service.find_task(ctl, call.principal, call.account, call.path("taskId"))


@routes.route(
    "POST",
    TASKS,
    summary="Launch a task: QUEUED until a cluster with the GPU has room, then it runs to completion.",
    description="Defaults: maxQueuedDuration PT72H, terminationGracePeriodDuration PT1H (or the "
    "maxRuntimeDuration when that is shorter), resultHandlingStrategy UPLOAD (results are kept by the "
    "platform and downloadable; no NGC key needed). The GPU and instance type must be offered by a "
    "registered cluster the account may use.",
    tag=TAG,
    scopes=(S.LAUNCH_TASK,),
    body=CreateTaskRequest,
    response=TaskResponse,
    cross_account=True,
)
async def create_task(ctl: Control, call: Call[CreateTaskRequest]) -> TaskResponse:
    task = await service.create_task(ctl, call.principal, call.account, call.body)
    return TaskResponse(task=task_dto(task, include_secrets=True))


@routes.route(
    "GET",
    TASKS,
    summary="List the account's tasks, oldest first, a page at a time.",
    tag=TAG,
    scopes=(S.LIST_TASKS,),
    response=TaskListResponse,
    params=(
        Param(name="status", description="Only tasks in this status (any case; comma-separated for several)."),
        *page_params("Tasks"),
    ),
    cross_account=True,
)
async def list_tasks(ctl: Control, call: Call[None]) -> TaskListResponse:
    limit = limit_of(call)
    statuses = service.parse_statuses(call.query_list("status"))
    page = service.list_tasks(
        ctl, call.principal, call.account, statuses=statuses, cursor=call.query("cursor"), limit=limit
    )
    return TaskListResponse(
        tasks=tuple(task_dto(t, include_secrets=False) for t in page.items), limit=limit, cursor=page.cursor
    )


@routes.route(
    "POST",
    f"{TASKS}/bulk",
    summary="Read the status of several tasks at once; ids that are unknown or not the caller's are left out.",
    tag=TAG,
    scopes=(S.LIST_TASKS,),
    body=BulkTasksRequest,
    response=BulkTasksResponse,
    cross_account=True,
)
async def bulk_get_tasks(ctl: Control, call: Call[BulkTasksRequest]) -> BulkTasksResponse:
    found = await service.bulk_tasks(ctl, call.principal, call.account, call.body.task_ids)
    return BulkTasksResponse(nca_id=call.account, tasks=tuple(task_summary(t) for t in found))


@routes.route(
    "GET",
    TASK,
    summary="Read a task, with its instance and (includeSecrets) the names of its secrets.",
    tag=TAG,
    scopes=(S.TASK_DETAILS,),
    response=TaskResponse,
    params=(Param(name="includeSecrets", description="Include secret names.", schema={"type": "boolean"}),),
    errors=(404,),
    cross_account=True,
)
async def get_task(ctl: Control, call: Call[None]) -> TaskResponse:
    task = await find(ctl, call)
    return TaskResponse(task=task_dto(task, include_secrets=call.query_bool("includeSecrets")))


@routes.route(
    "POST",
    f"{TASK}/cancel",
    summary="Cancel a task that has not finished: CANCELED, and its instance is stopped.",
    tag=TAG,
    scopes=(S.CANCEL_TASK,),
    response=TaskResponse,
    errors=(404,),
    cross_account=True,
)
async def cancel_task(ctl: Control, call: Call[None]) -> TaskResponse:
    task = await service.cancel_task(ctl, call.principal, call.account, call.path("taskId"))
    return TaskResponse(task=task_dto(task, include_secrets=False))


@routes.route(
    "DELETE",
    TASK,
    summary="Delete a task with its events, results and secrets; a running instance is stopped first.",
    tag=TAG,
    scopes=(S.DELETE_TASK,),
    errors=(404,),
    cross_account=True,
)
async def delete_task(ctl: Control, call: Call[None]) -> None:
    await service.delete_task(ctl, call.principal, call.account, call.path("taskId"))


@routes.route(
    "GET",
    f"{TASK}/events",
    summary="A task's events (every status change), oldest first, a page at a time.",
    tag=TAG,
    scopes=(S.LIST_EVENTS,),
    response=TaskEventListResponse,
    params=page_params("Events"),
    errors=(404,),
    cross_account=True,
)
async def list_task_events(ctl: Control, call: Call[None]) -> TaskEventListResponse:
    limit = limit_of(call)
    page = await service.list_events(ctl, await find(ctl, call), call.query("cursor"), limit)
    return TaskEventListResponse(events=page.items, limit=limit, cursor=page.cursor)


@routes.route(
    "GET",
    f"{TASK}/results",
    summary="A task's results, oldest first, a page at a time.",
    tag=TAG,
    scopes=(S.LIST_RESULTS,),
    response=TaskResultListResponse,
    params=page_params("Results"),
    errors=(404,),
    cross_account=True,
)
async def list_task_results(ctl: Control, call: Call[None]) -> TaskResultListResponse:
    limit = limit_of(call)
    page = await service.list_results(ctl, await find(ctl, call), call.query("cursor"), limit)
    return TaskResultListResponse(results=tuple(result_dto(r) for r in page.items), limit=limit, cursor=page.cursor)


@routes.route(
    "GET",
    f"{TASK}/results/{{resultId}}/content",
    summary="Download a result's content (tasks with resultHandlingStrategy UPLOAD).",
    tag=TAG,
    scopes=(S.LIST_RESULTS,),
    raw_response="application/octet-stream",
    errors=(404, 503),
    cross_account=True,
)
async def download_task_result(ctl: Control, call: Call[None]) -> web.StreamResponse:
    task = await find(ctl, call)
    result = await service.find_result(ctl, task, call.path("resultId"))
    return await stream_result(ctl, call, result)


async def stream_result(ctl: Control, call: Call[None], result: TaskResult) -> web.StreamResponse:
    objects = ctl.bus.objects(buckets.TASK_RESULT_CONTENT.name)
    name = result.object_name or buckets.task_result_object(result.task_id, result.result_id)
    return await stream_object(
        call.request,
        objects.open(name),
        headers={"Content-Type": "application/octet-stream", "Content-Disposition": attachment(result.name)},
        missing=f"Result '{result.result_id}' of task '{result.task_id}' has no stored content",
        what=f"result {result.result_id} of task {result.task_id}",
        log=ctl.log,
    )


@routes.route(
    "PUT",
    "/v1/nvct/secrets/tasks/{taskId}",
    summary="Add or replace secrets of a task (merged over its existing ones); 204.",
    description="Only a task created with secrets, and only until it finishes. Values are never returned.",
    tag=TAG,
    scopes=(S.UPDATE_SECRETS,),
    body=SecretsRequest,
    errors=(404,),
    cross_account=True,
)
async def update_task_secrets(ctl: Control, call: Call[SecretsRequest]) -> None:
    await service.update_secrets(ctl, call.principal, call.account, call.path("taskId"), call.body.secrets)


def attachment(name: str) -> str:
    """``attachment; filename="…"`` with the result's own name, made safe for a header."""
    base = name.replace("\\", "/").rsplit("/", 1)[-1]
    safe = "".join(ch if ch.isascii() and ch.isprintable() and ch not in '"' else "_" for ch in base) or "result"
    return f'attachment; filename="{safe}"'
