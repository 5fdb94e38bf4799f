"""How tasks, their events and results are shown: NVCT's ``TaskDto`` without the platform's bookkeeping.

The response types here are the OpenAPI document's closed schemas of the ``/v1/nvct`` routes, so a
bookkeeping field of :class:`~nvcf_mono.models.task.Task` can never reach a client unnoticed.
"""

from __future__ import annotations

from typing import Any

import attrs

from nvcf_mono.models.common import KeyValue
from nvcf_mono.models.task import (
    ResultHandlingStrategy,
    Task,
    TaskEvent,
    TaskGpuSpecification,
    TaskHealthInfo,
    TaskInstance,
    TaskResult,
    TaskStatus,
)
from nvcf_mono.models.telemetry import TelemetryIds
from nvcf_mono.structure import WireModel, wire


@wire
class TaskDto(WireModel):
    """A task as NVCT shows it."""

    id: str
    nca_id: str
    name: str
    status: TaskStatus
    gpu_specification: TaskGpuSpecification
    created_at: str
    last_updated_at: str
    result_handling_strategy: ResultHandlingStrategy
    max_queued_duration: str
    termination_grace_period_duration: str
    percent_complete: int
    instances: tuple[TaskInstance, ...]
    container_image: str | None = None
    helm_chart: str | None = None
    container_args: str | None = None
    container_environment: tuple[KeyValue, ...] | None = None
    max_runtime_duration: str | None = None
    results_location: str | None = None
    #: Names only, and only when asked for (``includeSecrets``).
    secrets: tuple[str, ...] | None = None
    tags: tuple[str, ...] | None = None
    description: str | None = None
    telemetries: TelemetryIds | None = None
    last_heartbeat_at: str | None = None
    health_info: TaskHealthInfo | None = None


#: Fields of the stored task that never leave the control plane.
BOOKKEEPING = frozenset(
    {
        "request_id",
        "cluster_id",
        "placed_at",
        "launched_at",
        "running_at",
        "finished_at",
        "progress_name",
        "progress_metadata",
        "events",
        "terminating",
        "result_bytes",
    }
)
_SHOWN = tuple(field.name for field in attrs.fields(TaskDto))


def task_dto(task: Task, *, include_secrets: bool) -> TaskDto:
    """The task without its bookkeeping; secret names only when ``include_secrets``."""
    shown: dict[str, Any] = {name: getattr(task, name) for name in _SHOWN}
    if not include_secrets:
        shown["secrets"] = None
    return TaskDto(**shown)


@wire
class TaskResponse(WireModel):
    """``{task}``."""

    task: TaskDto


@wire
class TaskListResponse(WireModel):
    """One page of tasks; ``cursor`` (absent on the last page) asks for the next."""

    tasks: tuple[TaskDto, ...]
    limit: int
    cursor: str | None = None


@wire
class TaskSummary(WireModel):
    """A task in a bulk read."""

    id: str
    name: str
    status: TaskStatus


@wire
class BulkTasksResponse(WireModel):
    """``{ncaId, tasks}``: the asked-for tasks the caller may see (unknown ids are left out)."""

    nca_id: str
    tasks: tuple[TaskSummary, ...]


def task_summary(task: Task) -> TaskSummary:
    return TaskSummary(id=task.id, name=task.name, status=task.status)


@wire
class TaskEventListResponse(WireModel):
    """One page of a task's events, oldest first."""

    events: tuple[TaskEvent, ...]
    limit: int
    cursor: str | None = None


@wire
class TaskResultDto(WireModel):
    """One result of a task; with ``UPLOAD``, its content is at ``.../results/{resultId}/content``."""

    result_id: str
    task_id: str
    nca_id: str
    name: str
    created_at: str
    metadata: Any = None
    #: Bytes of the stored content (absent when none was kept).
    size: int | None = None


def result_dto(result: TaskResult) -> TaskResultDto:
    return TaskResultDto(
        result_id=result.result_id,
        task_id=result.task_id,
        nca_id=result.nca_id,
        name=result.name,
        created_at=result.created_at,
        metadata=result.metadata,
        size=result.size if result.object_name is not None else None,
    )


@wire
class TaskResultListResponse(WireModel):
    """One page of a task's results, oldest first."""

    results: tuple[TaskResultDto, ...]
    limit: int
    cursor: str | None = None
