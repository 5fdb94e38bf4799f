"""What task workers report (through their invocation node), on ``nvcf.task.<call>``.

``connect``: the task becomes LAUNCHED. ``heartbeat``: the first makes it RUNNING, each one records
the progress (``percentComplete`` never goes down), 100 completes it. ``result``: one result file,
named, with its content in the object store (strategy UPLOAD) or not kept (NONE). Served by every
control-plane process in one queue group; every write is a CAS.
"""

from __future__ import annotations

import logging
from typing import final

from anyio.abc import TaskStatus as ReadyStatus

from nvcf_mono.bus.mirror import Unchanged
from nvcf_mono.bus.upload_room import upload_room
from nvcf_mono.contracts import buckets, rpc, subjects
from nvcf_mono.contracts.messages import (
    TaskConnectCall,
    TaskConnectReply,
    TaskHeartbeatCall,
    TaskResultCall,
    TaskResultReply,
    TaskRoomCall,
    TaskRoomReply,
    TaskStatusReply,
)
from nvcf_mono.contracts.rpc import RpcError
from nvcf_mono.models.common import new_id, now_iso
from nvcf_mono.models.task import TERMINAL, ResultHandlingStrategy, Task, TaskResult, TaskStatus
from nvcf_mono.planes.control.context import Control
from nvcf_mono.planes.control.tasks.lifecycle import transition
from nvcf_mono.structure import evolve


@final
class TaskWorkerCalls:
    def __init__(self, ctl: Control, log: logging.Logger) -> None:
        self._ctl = ctl
        self._log = log

    async def serve(self, *, task_status: ReadyStatus[None]) -> None:
        endpoints: dict[str, rpc.Endpoint] = {
            "connect": (TaskConnectCall, self.connect),
            "heartbeat": (TaskHeartbeatCall, self.heartbeat),
            "room": (TaskRoomCall, self.room),
            "result": (TaskResultCall, self.result),
        }
        handler = rpc.dispatcher(endpoints, lambda subject: subject.rsplit(".", 1)[-1])
        await self._ctl.bus.serve(
            subjects.TASK_CALLS, handler, queue=subjects.ICMS_QUEUE, concurrency=32, task_status=task_status
        )

    async def _task(self, task_id: str) -> Task:
        task = await self._ctl.store.tasks.fetch(task_id)
        if task is None:
            raise RpcError(404, f"task {task_id} does not exist")
        return task

    async def connect(self, subject: str, call: TaskConnectCall) -> TaskConnectReply:
        task = await self._task(call.task_id)
        if task.request_id != call.request_id:
            raise RpcError(409, f"task {task.id} runs on another instance request")
        if task.status is TaskStatus.QUEUED:
            stamp = now_iso()
            moved = await transition(
                self._ctl,
                task.id,
                TaskStatus.LAUNCHED,
                expected={TaskStatus.QUEUED},
                change=lambda t: evolve(t, launched_at=stamp),
            )
            task = moved or await self._task(task.id)
        return TaskConnectReply(
            status=task.status.value,
            heartbeat_interval=self._ctl.config.tasks.heartbeat_interval,
            result_handling=task.result_handling_strategy.value,
        )

    async def heartbeat(self, subject: str, call: TaskHeartbeatCall) -> TaskStatusReply:
        task = await self._task(call.task_id)
        if task.status in TERMINAL:
            return TaskStatusReply(status=task.status.value)
        stamp = now_iso()

        def progressed(t: Task) -> Task:
            if not call.has_progress:
                return evolve(t, last_heartbeat_at=stamp)
            return evolve(
                t,
                last_heartbeat_at=stamp,
                percent_complete=max(t.percent_complete, min(call.percent_complete, 100)),
                progress_name=call.name,
                progress_metadata=call.metadata,
                last_updated_at=stamp,
            )

        if task.status in (TaskStatus.QUEUED, TaskStatus.LAUNCHED):
            await transition(
                self._ctl,
                task.id,
                TaskStatus.RUNNING,
                expected={TaskStatus.QUEUED, TaskStatus.LAUNCHED},
                change=lambda t: evolve(progressed(t), running_at=stamp, launched_at=t.launched_at or stamp),
            )
        else:

            def beat(current: Task | None) -> Task:
                if current is None or current.status in TERMINAL:
                    raise Unchanged
                return progressed(current)

            await self._ctl.store.tasks.mutate(task.id, beat)
        if call.has_progress and call.percent_complete >= 100:
            await transition(self._ctl, task.id, TaskStatus.COMPLETED, expected={TaskStatus.RUNNING})
        current = await self._task(task.id)
        return TaskStatusReply(status=current.status.value)

    async def _check_count(self, task: Task) -> None:
        kept = await self._ctl.store.task_results.kv.keys(buckets.task_item_pattern(task.id))
        if len(kept) >= self._ctl.config.tasks.max_results:
            raise RpcError(400, f"task {task.id} already has {len(kept)} results, the most one task may keep")

    async def room(self, subject: str, call: TaskRoomCall) -> TaskRoomReply:
        """Before a result's content is stored: whether the task may add one, and how large."""
        task = await self._task(call.task_id)
        await self._check_count(task)
        if task.result_handling_strategy is ResultHandlingStrategy.NONE:
            # Its worker sends names and sizes only; content sent anyway (a worker not to be trusted) is refused.
            return TaskRoomReply(max_bytes=0, why="the task's resultHandlingStrategy is NONE: no content is kept")
        settings = self._ctl.config.tasks
        most = settings.max_result_size
        reply = TaskRoomReply(max_bytes=most, why=f"a result file may hold {most} bytes")
        quota = settings.max_account_result_bytes
        if quota:
            used = sum(t.result_bytes for t in self._ctl.store.tasks.values() if t.nca_id == task.nca_id)
            left = max(0, quota - used)
            reply = evolve(reply, account=task.nca_id, account_left=left)
            if left < reply.max_bytes:
                reply = evolve(
                    reply,
                    max_bytes=left,
                    why=f"the account's tasks may keep {quota} bytes of results together and hold {used}; "
                    "delete finished tasks whose results are no longer needed",
                )
        room = await upload_room(self._ctl.bus, self._ctl.settings).left()
        if room is not None and room < reply.max_bytes:
            reply = evolve(
                reply,
                max_bytes=room,
                why="the platform's message store has no more room for results (the rest is kept for queued "
                "requests); delete results no longer needed, or ask the operator for a larger store",
                passing=True,
            )
        return reply

    async def result(self, subject: str, call: TaskResultCall) -> TaskResultReply:
        task = await self._task(call.task_id)
        store = self._ctl.store
        await self._check_count(task)
        result = TaskResult(
            result_id=new_id(),
            task_id=task.id,
            nca_id=task.nca_id,
            name=call.name,
            created_at=now_iso(),
            metadata=call.metadata,
            size=call.size,
            object_name=call.object_name,
        )
        await store.task_results.put(f"{task.id}.{result.result_id}", result)
        if call.object_name is not None:  # its content is kept: it counts toward the account's quota

            def counted(current: Task | None) -> Task:
                if current is None:
                    raise Unchanged
                return evolve(current, result_bytes=current.result_bytes + call.size)

            await store.tasks.mutate(task.id, counted)
        self._log.info("task %s: result %s (%d bytes)", task.id, call.name, call.size)
        return TaskResultReply(result_id=result.result_id)
