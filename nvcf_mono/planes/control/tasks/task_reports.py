"""What cluster agents report about task instances (the ICMS calls with a ``taskId``).

The instance's state is kept on the task (``instances``); how it ended decides the task's end when
the worker did not already: the task's process exiting 0 is COMPLETED, a non-zero exit ERRORED with
the end of its log, the agent's deadline EXCEEDED_MAX_RUNTIME_DURATION, and any other end of the
instance (it could not start, it was lost) ERRORED with the reason.
"""

from __future__ import annotations

import logging

from nvcf_mono.bus.mirror import Unchanged
from nvcf_mono.contracts import states
from nvcf_mono.contracts.messages import InstanceStatusReport, ListedInstance
from nvcf_mono.contracts.rpc import RpcError
from nvcf_mono.models.common import now_iso
from nvcf_mono.models.task import INSTANCE_TERMINATED, TERMINAL, Task, TaskInstance, TaskStatus
from nvcf_mono.planes.control.context import Control
from nvcf_mono.planes.control.tasks.lifecycle import transition
from nvcf_mono.structure import evolve


def instance_state(report: InstanceStatusReport) -> str:
    """The agent's ``instanceState`` in TaskDto's words."""
    if report.instance_state in states.GONE_STATES:
        return INSTANCE_TERMINATED
    if report.instance_state == states.RUNNING:
        return "RUNNING"
    return "STARTING"


async def ack(ctl: Control, task_id: str, request_id: str) -> None:
    """The agent holds the task's instance request; 404 when the task does not want it (any more)."""
    task = await ctl.store.tasks.fetch(task_id)
    if task is None or task.request_id != request_id or task.status in TERMINAL:
        raise RpcError(404, f"task instance request {request_id!r} is not wanted")


async def status(ctl: Control, report: InstanceStatusReport, log: logging.Logger) -> bool:
    """Record one report; False when the task does not know this instance (the agent stops it)."""
    task_id = report.task_id or ""
    task = await ctl.store.tasks.fetch(task_id)
    if task is None or task.request_id != report.request_id:
        return False
    cluster = ctl.store.clusters.get(task.cluster_id or "")
    stamp = now_iso()
    seen = TaskInstance(
        instance_id=report.instance_id,
        instance_state=instance_state(report),
        gpu=task.gpu_specification.gpu,
        instance_type=task.gpu_specification.instance_type,
        backend=cluster.cluster_group_name if cluster is not None else (task.gpu_specification.backend or ""),
        location=cluster.region if cluster is not None else None,
        instance_created_at=task.instances[0].instance_created_at if task.instances else stamp,
        instance_updated_at=stamp,
    )

    def note(current: Task | None) -> Task:
        if current is None:
            raise Unchanged
        last = current.instances[0] if current.instances else None
        if last is not None and (last.instance_state, last.instance_id) == (seen.instance_state, seen.instance_id):
            raise Unchanged  # nothing new but the time
        return evolve(current, instances=(seen,))

    await ctl.store.tasks.mutate(task.id, note)
    if report.instance_state in states.GONE_STATES and task.status not in TERMINAL:
        await _ended(ctl, task, report, log)
    return True


async def _ended(ctl: Control, task: Task, report: InstanceStatusReport, log: logging.Logger) -> None:
    error_log = report.health_info.error_log if report.health_info is not None else ""
    cause = report.termination_cause or report.instance_state
    if report.instance_state == states.SUCCEEDED:
        to, error = TaskStatus.COMPLETED, None
    elif cause == states.EXCEEDED_MAX_RUNTIME:
        to, error = TaskStatus.EXCEEDED_MAX_RUNTIME_DURATION, error_log or "ran past its maxRuntimeDuration"
    elif report.instance_state == states.TERMINATED:
        to, error = TaskStatus.ERRORED, f"the task's instance was terminated ({cause})"
    else:
        to, error = TaskStatus.ERRORED, error_log or cause
    ended = await transition(ctl, task.id, to, error=error)
    if ended is not None:
        log.info("task %s: %s (%s)", task.id, to.value, cause)


def listed(ctl: Control, cluster_id: str) -> list[ListedInstance]:
    """The task instances this cluster should hold (so its periodic sync keeps them)."""
    out = []
    for task in ctl.store.tasks.values():
        if task.cluster_id != cluster_id or task.request_id is None:
            continue
        if task.instance_gone:
            continue
        state = task.instances[0].instance_state if task.instances else "STARTING"
        out.append(
            ListedInstance(
                instance_id=task.instances[0].instance_id if task.instances else None,
                request_id=task.request_id,
                instance_state=states.RUNNING if state == "RUNNING" else states.STARTING,
            )
        )
    return out
