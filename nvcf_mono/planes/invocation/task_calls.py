"""The task RPCs of the WorkerService: a task's worker reports through its invocation node.

The node checks the worker token (it names the task), stores uploaded result files in the
``nvcf_task_results`` object store, and passes each call to the control plane on the bus
(``nvcf.task.<call>``); the control plane's answer (or refusal) goes back to the worker.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterable, AsyncIterator, Callable
from typing import Any, final

import anyio
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.server import Stream

from nvcf_mono.account_uploads import AccountUploads, Flow
from nvcf_mono.auth.tokens import WORKER
from nvcf_mono.bus.api import Bus
from nvcf_mono.bus.errors import BusError
from nvcf_mono.bus.upload_room import UploadRoom, held_to
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
from nvcf_mono.models.common import new_id
from nvcf_mono.proto.gen.nvcf.worker.v1 import (
    TaskConnectRequest,
    TaskConnectResponse,
    TaskHeartbeatRequest,
    TaskHeartbeatResponse,
    TaskResultAck,
    TaskResultChunk,
)

#: How long the control plane may take to answer a task call.
CALL_TIMEOUT = 10.0
_CODES = {400: Status.INVALID_ARGUMENT, 404: Status.NOT_FOUND, 409: Status.FAILED_PRECONDITION}


@final
class TaskCalls:
    """Handlers the WorkerService mounts; ``verify`` checks a worker token and returns its claims."""

    def __init__(
        self,
        verify: Callable[[str, str], dict[str, Any]],
        bus: Callable[[], Bus],
        room: Callable[[], UploadRoom],
        log: logging.Logger,
    ):
        self._verify = verify
        self._bus = bus
        self._room = room
        self._log = log
        #: Result content being stored on this node, per account, until it is recorded.
        self._uploads = AccountUploads()

    def _task(self, token: str) -> dict[str, Any]:
        claims = self._verify(token, WORKER)
        if not claims.get("tid"):
            raise GRPCError(Status.PERMISSION_DENIED, "this worker token is not a task's")
        return claims

    async def _call(self, call: subjects.TaskCall, body: Any, reply: type[Any]) -> Any:
        try:
            return await rpc.call(self._bus(), subjects.task_subject(call), body, reply, timeout=CALL_TIMEOUT)
        except rpc.RpcError as err:
            raise GRPCError(_CODES.get(err.code, Status.UNAVAILABLE), err.message) from err
        except BusError as err:
            raise GRPCError(Status.UNAVAILABLE, f"the control plane did not answer: {err}") from err

    async def connect(self, stream: Stream[TaskConnectRequest, TaskConnectResponse]) -> None:
        req = await stream.recv_message()
        assert req is not None
        claims = self._task(req.worker_token)
        answer: TaskConnectReply = await self._call(
            "connect",
            TaskConnectCall(task_id=str(claims["tid"]), request_id=str(claims["rid"]), instance_id=req.instance_id),
            TaskConnectReply,
        )
        await stream.send_message(
            TaskConnectResponse(
                task_id=str(claims["tid"]),
                status=answer.status,
                heartbeat_interval_ms=int(answer.heartbeat_interval * 1000),
                result_handling=answer.result_handling,
            )
        )

    async def heartbeat(self, stream: Stream[TaskHeartbeatRequest, TaskHeartbeatResponse]) -> None:
        req = await stream.recv_message()
        assert req is not None
        claims = self._task(req.worker_token)
        try:
            metadata = json.loads(req.metadata_json) if req.metadata_json else None
        except ValueError:
            metadata = None
        answer: TaskStatusReply = await self._call(
            "heartbeat",
            TaskHeartbeatCall(
                task_id=str(claims["tid"]),
                has_progress=req.has_progress,
                percent_complete=req.percent_complete,
                name=req.name or None,
                metadata=metadata,
                last_updated_at=req.last_updated_at or None,
            ),
            TaskStatusReply,
        )
        await stream.send_message(TaskHeartbeatResponse(status=answer.status))

    async def upload(self, stream: Stream[TaskResultChunk, TaskResultAck]) -> None:
        first = await stream.recv_message()
        if first is None:
            raise GRPCError(Status.INVALID_ARGUMENT, "no result chunk")
        claims = self._task(first.worker_token)
        task_id = str(claims["tid"])
        name = first.name.strip()
        if not name or len(name) > 1024 or name.startswith("/") or ".." in name.split("/"):
            raise GRPCError(Status.INVALID_ARGUMENT, f"invalid result name {first.name!r}")
        second = await stream.recv_message()
        try:
            metadata = json.loads(first.metadata_json) if first.metadata_json else None
        except ValueError:
            metadata = None
        if not first.data and second is None:  # a name alone (result handling NONE) stores nothing
            answer = await self._record(TaskResultCall(task_id=task_id, name=name, size=first.size, metadata=metadata))
            await stream.send_message(TaskResultAck(result_id=answer.result_id))
            return
        room: TaskRoomReply = await self._call("room", TaskRoomCall(task_id=task_id), TaskRoomReply)
        object_name = buckets.task_result_object(task_id, new_id())
        pieces = _chain((first, second), stream if second is not None else None)
        # Until it is recorded, what it brings counts against the account's quota for its other results.
        with self._uploads.flow(room.account) as flow:
            size = await self._store(name, object_name, pieces, room=room, flow=flow, declared=first.size)
            answer = await self._record(
                TaskResultCall(task_id=task_id, name=name, size=size, metadata=metadata, object_name=object_name)
            )
        await stream.send_message(TaskResultAck(result_id=answer.result_id))

    async def _record(self, call: TaskResultCall) -> TaskResultReply:
        try:
            answer: TaskResultReply = await self._call("result", call, TaskResultReply)
        except BaseException:
            if call.object_name is not None:  # not recorded: its content would be kept by nothing
                with anyio.move_on_after(CALL_TIMEOUT, shield=True):
                    await self._forget(call.object_name)
            raise
        return answer

    async def _store(
        self,
        name: str,
        object_name: str,
        pieces: AsyncIterable[TaskResultChunk],
        *,
        room: TaskRoomReply,
        flow: Flow,
        declared: int,
    ) -> int:
        """Store a result's content, no larger than the control plane allows now; its size.

        Refused with ``RESOURCE_EXHAUSTED`` past a limit that stays, ``UNAVAILABLE`` past the store's room
        (it frees as queues drain: the worker tries again later). The worker's ``declared`` size refuses
        it before any byte is stored; the bytes themselves are held to the limit whatever it declared.
        """

        def refuse() -> GRPCError:
            status = Status.UNAVAILABLE if room.passing else Status.RESOURCE_EXHAUSTED
            return GRPCError(status, f"result {name!r} is too large: {room.why}")

        def over_quota(others: int) -> GRPCError:
            """The account's quota, beside its other results being stored on this node."""
            return GRPCError(
                Status.RESOURCE_EXHAUSTED,
                f"result {name!r} is too large: its account's quota leaves {room.account_left} bytes for "
                f"results and its other results being stored bring {others}; delete finished tasks whose "
                "results are no longer needed",
            )

        if declared > room.max_bytes:
            raise refuse()
        flow.reach(declared, room.account_left, over_quota)

        async def data() -> AsyncIterator[bytes]:
            received = 0
            async for chunk in pieces:
                if chunk.data:
                    received += len(chunk.data)
                    flow.reach(received, room.account_left, over_quota)
                    yield chunk.data

        def no_room() -> GRPCError:
            return GRPCError(Status.UNAVAILABLE, f"result {name!r} does not fit in the platform's message store now")

        objects = self._bus().objects(buckets.TASK_RESULT_CONTENT.name)
        try:
            # Held to the store's room as this node sees it too: results stored at once share it.
            held = self._room().hold(held_to(data(), room.max_bytes, refuse), no_room)
            info = await objects.put(object_name, held)
        except BusError as err:
            raise GRPCError(Status.UNAVAILABLE, f"result {name!r} could not be stored: {err}") from err
        return info.size

    async def _forget(self, object_name: str) -> None:
        try:
            await self._bus().objects(buckets.TASK_RESULT_CONTENT.name).delete(object_name)
        except BusError as err:
            self._log.warning("could not remove the content of an unrecorded result %s: %s", object_name, err)


async def _chain(
    head: tuple[TaskResultChunk, TaskResultChunk | None], rest: AsyncIterable[TaskResultChunk] | None
) -> AsyncIterator[TaskResultChunk]:
    for chunk in head:
        if chunk is not None:
            yield chunk
    if rest is not None:
        async for chunk in rest:
            yield chunk
