"""Tasks (NVCT): run-to-completion GPU jobs, as NVCF shows them (``TaskDto``) and as they are stored.

Bucket ``nvcf_tasks`` holds one :class:`Task` per task (key: the task id); events and results have
buckets of their own. Fields after ``instances`` are the platform's own bookkeeping and never leave
the control plane (:func:`nvcf_mono.planes.control.tasks.views.task_dto` drops them).
"""

from __future__ import annotations

import enum
from typing import Any

from nvcf_mono.models.common import (
    KeyValue,
    NameValue,
    image_reference,
    iso_duration_at_most,
    max_items,
    max_len,
    name_check,
)
from nvcf_mono.models.telemetry import TelemetryIds
from nvcf_mono.structure import WireModel, checked, wire


class TaskStatus(enum.Enum):
    """Reference control-plane §3.3."""

    QUEUED = "QUEUED"
    LAUNCHED = "LAUNCHED"
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    ERRORED = "ERRORED"
    CANCELED = "CANCELED"
    EXCEEDED_MAX_RUNTIME_DURATION = "EXCEEDED_MAX_RUNTIME_DURATION"
    EXCEEDED_MAX_QUEUED_DURATION = "EXCEEDED_MAX_QUEUED_DURATION"


TERMINAL = frozenset(
    {
        TaskStatus.COMPLETED,
        TaskStatus.ERRORED,
        TaskStatus.CANCELED,
        TaskStatus.EXCEEDED_MAX_RUNTIME_DURATION,
        TaskStatus.EXCEEDED_MAX_QUEUED_DURATION,
    }
)


class ResultHandlingStrategy(enum.Enum):
    """``UPLOAD``: results are stored by the platform and downloadable; ``NONE``: metadata only."""

    UPLOAD = "UPLOAD"
    NONE = "NONE"


DEFAULT_MAX_QUEUED = "PT72H"
DEFAULT_GRACE = "PT1H"


@wire
class TaskGpuSpecification(WireModel):
    """Where a task runs."""

    gpu: str = checked(check=max_len(128))
    instance_type: str = checked(check=max_len(256))
    backend: str | None = checked(None, check=max_len(256))
    clusters: tuple[str, ...] | None = checked(None, check=max_items(100))
    configuration: Any = None
    helm_validation_policy: Any = None


@wire
class CreateTaskRequest(WireModel):
    """Body of ``POST /v1/nvct/tasks``."""

    name: str = checked(check=name_check)
    gpu_specification: TaskGpuSpecification
    container_image: str | None = checked(None, check=image_reference)
    helm_chart: str | None = checked(None, check=max_len(1024))
    container_args: str | None = checked(None, check=max_len(8192))
    container_environment: tuple[KeyValue, ...] | None = checked(None, check=max_items(256))
    # Bounded so a timer or a date never overflows: a month to run or to wait, a day to stop.
    max_runtime_duration: str | None = checked(None, check=iso_duration_at_most("P30D"))
    max_queued_duration: str | None = checked(None, check=iso_duration_at_most("P30D"))
    termination_grace_period_duration: str | None = checked(None, check=iso_duration_at_most("P1D"))
    result_handling_strategy: ResultHandlingStrategy | None = None
    results_location: str | None = checked(None, check=max_len(1024))
    secrets: tuple[NameValue, ...] | None = None
    tags: tuple[str, ...] | None = checked(None, check=max_items(64))
    description: str | None = checked(None, check=max_len(256))
    telemetries: TelemetryIds | None = None
    # NVCF's schema has them; this platform does not run them: present means a clear 400.
    models: Any = None
    resources: Any = None


@wire
class TaskHealthInfo(WireModel):
    """Why a task did not run as asked (the last error), with where it was placed."""

    gpu: str | None = None
    backend: str | None = None
    instance_type: str | None = None
    error: str | None = None


#: The ``instanceState`` of a task's instance that no longer exists.
INSTANCE_TERMINATED = "TERMINATED"


@wire
class TaskInstance(WireModel):
    """The instance a task runs on (``instances`` of ``TaskDto``)."""

    instance_id: str
    instance_state: str  # ACTIVE, STARTING, RUNNING, TERMINATED, PREEMPTED, DELETED
    gpu: str
    instance_type: str
    backend: str
    location: str | None = None
    instance_created_at: str | None = None
    instance_updated_at: str | None = None


@wire
class Task(WireModel):
    """A task: what ``TaskDto`` shows, then the platform's bookkeeping."""

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
    container_image: str | None = None
    helm_chart: str | None = None
    container_args: str | None = None
    container_environment: tuple[KeyValue, ...] | None = None
    max_runtime_duration: str | None = None
    results_location: str | None = None
    secrets: tuple[str, ...] | None = None
    tags: tuple[str, ...] | None = None
    description: str | None = None
    telemetries: TelemetryIds | None = None
    percent_complete: int = 0
    last_heartbeat_at: str | None = None
    health_info: TaskHealthInfo | None = None
    instances: tuple[TaskInstance, ...] = ()
    # ---- bookkeeping (never returned) ----
    #: The creation request sent for it (one instance), and where it went.
    request_id: str | None = None
    cluster_id: str | None = None
    placed_at: str | None = None
    launched_at: str | None = None
    running_at: str | None = None
    finished_at: str | None = None
    #: The last progress report's ``name`` and ``metadata``.
    progress_name: str | None = None
    progress_metadata: Any = None
    #: Events written so far (the next event's sequence number).
    events: int = 0
    #: True once the instance was asked to stop (cancel, a terminal state).
    terminating: bool = False
    #: Bytes of result content stored for it (its account's results are held to a quota together).
    result_bytes: int = 0

    @property
    def instance_gone(self) -> bool:
        """Its instance reported that it no longer exists."""
        return bool(self.instances) and all(i.instance_state == INSTANCE_TERMINATED for i in self.instances)


@wire
class TaskEvent(WireModel):
    """One event of a task (``GET /v1/nvct/tasks/{id}/events``)."""

    event_id: str
    task_id: str
    nca_id: str
    message: str
    created_at: str


@wire
class TaskResult(WireModel):
    """One result of a task (``GET /v1/nvct/tasks/{id}/results``); its content is in the object store
    (``UPLOAD``) or was not kept (``NONE``).
    """

    result_id: str
    task_id: str
    nca_id: str
    name: str
    created_at: str
    metadata: Any = None
    size: int | None = None
    #: Name in the ``nvcf_task_results`` object store (None: not kept).
    object_name: str | None = None
