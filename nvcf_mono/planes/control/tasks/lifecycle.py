"""Task status changes: compare-and-set on the task, then its event, in the reference's words.

Every transition writes one event, ``Changing status from 'A' to 'B'`` (with `` with error '…'`` when
there is one). Terminal statuses never change again; a transition that finds the task elsewhere
than it expected changes nothing and returns None.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from nvcf_mono.bus.mirror import Unchanged
from nvcf_mono.contracts import buckets
from nvcf_mono.models.common import new_id, now_iso
from nvcf_mono.models.task import TERMINAL, Task, TaskEvent, TaskHealthInfo, TaskStatus
from nvcf_mono.planes.control.context import Control
from nvcf_mono.structure import evolve


def event_message(old: TaskStatus, new: TaskStatus, error: str | None = None) -> str:
    text = f"Changing status from '{old.value}' to '{new.value}'"
    return text if error is None else f"{text} with error '{error}'"


async def transition(
    ctl: Control,
    task_id: str,
    to: TaskStatus,
    *,
    error: str | None = None,
    expected: Collection[TaskStatus] | None = None,
    change: Callable[[Task], Task] | None = None,
) -> Task | None:
    """Move the task to ``to`` (and apply ``change``); None when it is gone, terminal or not where expected."""
    events: list[tuple[int, TaskEvent]] = []

    def update(current: Task | None) -> Task | None:
        events.clear()
        if current is None or current.status in TERMINAL or current.status is to:
            raise Unchanged
        if expected is not None and current.status not in expected:
            raise Unchanged
        stamp = now_iso()
        updated = change(current) if change is not None else current
        health = updated.health_info
        if error is not None:
            spec = current.gpu_specification
            health = TaskHealthInfo(
                gpu=spec.gpu, backend=spec.backend, instance_type=spec.instance_type, error=error[:4096]
            )
        event = TaskEvent(
            event_id=new_id(),
            task_id=current.id,
            nca_id=current.nca_id,
            message=event_message(current.status, to, error),
            created_at=stamp,
        )
        events.append((current.events, event))
        return evolve(
            updated,
            status=to,
            last_updated_at=stamp,
            health_info=health,
            events=current.events + 1,
            finished_at=stamp if to in TERMINAL else updated.finished_at,
        )

    result = await ctl.store.tasks.mutate(task_id, update)
    if not events or result is None:
        return None
    for sequence, event in events:
        await ctl.store.task_events.put(buckets.task_event_key(task_id, sequence), event)
    ctl.poke()
    return result


async def first_event(ctl: Control, task: Task) -> None:
    """The event of a new task, sequence 0 (a new task is stored with ``events=1``)."""
    event = TaskEvent(
        event_id=new_id(),
        task_id=task.id,
        nca_id=task.nca_id,
        message=f"Task created with status '{task.status.value}'",
        created_at=task.created_at,
    )
    await ctl.store.task_events.put(buckets.task_event_key(task.id, 0), event)
