"""The worker as a task's sidecar: reports the task's progress and uploads its results.

It connects (the task becomes LAUNCHED), heartbeats with the progress file's content (the first
heartbeat makes it RUNNING; ``percentComplete`` 100 completes it), and uploads each file that
appears in the results directory once it stops changing. Told to stop (SIGTERM: the task's process
ended, or the task is being stopped), it uploads what is left and sends a last heartbeat first.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any, final

import anyio
import attrs
from grpclib.const import Cardinality, Status
from grpclib.exceptions import GRPCError, StreamTerminatedError

from nvcf_mono.backoff import Backoff
from nvcf_mono.contracts import env
from nvcf_mono.contracts.telemetry import exports_problem, proxy_problem
from nvcf_mono.grpc.uploads import upload
from nvcf_mono.models.common import now_iso
from nvcf_mono.proto.gen.nvcf.worker.v1 import (
    TaskConnectRequest,
    TaskConnectResponse,
    TaskHeartbeatRequest,
    TaskHeartbeatResponse,
    TaskResultAck,
    TaskResultChunk,
)
from nvcf_mono.structure import at_least, in_range, optional
from nvcf_mono.worker import endpoint
from nvcf_mono.worker.agent import SERVICE, WorkerState
from nvcf_mono.worker.config import contract, from_contract, host_port

log = logging.getLogger("nvcf_mono.worker.task")

CHUNK = 256 * 1024
#: How often the results directory and the progress file are looked at.
SCAN_INTERVAL = 0.5
_LOST = (GRPCError, StreamTerminatedError, OSError, ConnectionError, TimeoutError)
#: What the platform answers a result it will not keep as sent (too large, over the task's count).
_REFUSED = frozenset({Status.INVALID_ARGUMENT, Status.RESOURCE_EXHAUSTED})
_TERMINAL = {"COMPLETED", "ERRORED", "CANCELED", "EXCEEDED_MAX_RUNTIME_DURATION", "EXCEEDED_MAX_QUEUED_DURATION"}


@attrs.frozen(kw_only=True)
class TaskConfig:
    """The task sidecar's settings, from the task contract (``contracts/env.py``)."""

    task_id: str = contract(env.NVCT_TASK_ID)
    worker_token: str = contract(env.NVCF_WORKER_TOKEN)
    grpc_address: str = contract(env.NVCF_FQDN_GRPC, check=host_port)
    grpc_tls: bool = contract(env.NVCF_FQDN_GRPC_TLS, False)
    grpc_ca: str | None = contract(env.NVCF_FQDN_GRPC_CA, None)
    instance_id: str = contract(env.INSTANCE_ID, "")
    progress_file: str = contract(env.NVCT_PROGRESS_FILE_PATH)
    results_dir: str = contract(env.NVCT_RESULTS_DIR)
    heartbeat_interval: float = contract(env.NVCT_HEARTBEAT_INTERVAL, 30.0, at_least(0.1))
    own_health_port: int = contract(env.HEALTH_PORT, 0, in_range(0, 65535))
    secrets_file: str | None = contract(env.SECRETS_FILE, None)
    secrets_refresh: float = contract(env.SECRETS_REFRESH_INTERVAL, 10.0, at_least(0))
    secrets_present: bool = contract(env.FUNCTION_SECRETS_PRESENT, False)
    grpc_address_file: str | None = contract(env.NVCF_FQDN_GRPC_FILE, None)
    #: The task's own telemetry receivers (``worker/telemetry.py``): its worker sends its log there.
    telemetry_exports: str | None = contract(env.NVCF_TELEMETRY_EXPORTS, None, optional(exports_problem))
    #: The operator's proxy to those receivers.
    telemetry_proxy: str | None = contract(env.NVCF_TELEMETRY_PROXY, None, optional(proxy_problem))

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> TaskConfig:
        """Read the task contract; every problem in one error, one line each."""
        return from_contract(cls, environ)


@attrs.frozen
class Progress:
    """What the task's progress file says."""

    percent: int
    name: str
    metadata: Any
    last_updated_at: str


def read_progress(path: str) -> Progress | None:
    """The progress file, or None while it is missing or half-written."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict):
        return None
    try:
        percent = int(doc.get("percentComplete", 0))
    except (TypeError, ValueError):
        return None
    return Progress(
        percent=max(0, min(percent, 100)),
        name=str(doc.get("name") or ""),
        metadata=doc.get("metadata"),
        last_updated_at=str(doc.get("lastUpdatedAt") or ""),
    )


@final
class TaskWorker:
    """One task's sidecar (``nvcf-mono worker`` when ``NVCT_TASK_ID`` is set)."""

    def __init__(self, config: TaskConfig) -> None:
        self.config = config
        self.state = WorkerState()
        self.state.inference_detail = ""
        self.state.inference_healthy = True  # nothing to probe: the task itself has no health endpoint
        self._drain = anyio.Event()
        #: name -> (size, mtime) uploaded, and what the last scan saw (a file is stable when unchanged).
        self._uploaded: dict[str, tuple[int, float]] = {}
        self._seen: dict[str, tuple[int, float]] = {}
        self._sent: Progress | None = None
        self._result_handling = "UPLOAD"
        self.status = "QUEUED"

    def request_drain(self) -> None:
        self._drain.set()

    async def run(self) -> None:
        async with endpoint.channel(self.config) as channel:
            await self._connect(channel)
            self.state.connected = True
            last_beat = -float("inf")
            while not self._drain.is_set():
                with anyio.move_on_after(SCAN_INTERVAL):
                    await self._drain.wait()
                if self._drain.is_set():
                    break
                await self._upload_stable(channel, final=False)
                progress = read_progress(self.config.progress_file)
                due = time.monotonic() - last_beat >= self.config.heartbeat_interval
                if due or (progress is not None and progress != self._sent):
                    if progress is not None and progress.percent >= 100:
                        await self._upload_stable(channel, final=True)  # results before completion
                    await self._heartbeat(channel, progress)
                    last_beat = time.monotonic()
            # Stopping: everything that is there, then the last word on progress.
            self.state.draining = True
            with anyio.CancelScope(shield=True), anyio.move_on_after(60):
                await self._upload_stable(channel, final=True)
                await self._heartbeat(channel, read_progress(self.config.progress_file))

    async def _connect(self, channel: Any) -> None:
        backoff = Backoff(0.2, 5.0)
        while True:
            try:
                with anyio.fail_after(30):
                    async with channel.request(
                        f"{SERVICE}/TaskConnect", Cardinality.UNARY_UNARY, TaskConnectRequest, TaskConnectResponse
                    ) as stream:
                        await stream.send_message(
                            TaskConnectRequest(
                                worker_token=self.config.worker_token, instance_id=self.config.instance_id
                            ),
                            end=True,
                        )
                        reply = await stream.recv_message()
                assert reply is not None
                self.status = reply.status
                self._result_handling = reply.result_handling or "UPLOAD"
                if reply.heartbeat_interval_ms > 0:
                    self.config = attrs.evolve(self.config, heartbeat_interval=reply.heartbeat_interval_ms / 1000)
                log.info("task %s: connected (%s)", reply.task_id, reply.status)
                return
            except _LOST as err:
                delay = backoff.next()
                self.state.connection_detail = f"not connected to the platform ({err})"
                log.warning("task connect failed (%s); retrying in %.1fs", err, delay)
                with anyio.move_on_after(delay):
                    await self._drain.wait()
                if self._drain.is_set():
                    raise

    async def _heartbeat(self, channel: Any, progress: Progress | None) -> None:
        req = TaskHeartbeatRequest(worker_token=self.config.worker_token)
        if progress is not None:
            req = TaskHeartbeatRequest(
                worker_token=self.config.worker_token,
                has_progress=True,
                percent_complete=progress.percent,
                name=progress.name,
                metadata_json=json.dumps(progress.metadata) if progress.metadata is not None else "",
                last_updated_at=progress.last_updated_at or now_iso(),
            )
        try:
            with anyio.fail_after(30):
                async with channel.request(
                    f"{SERVICE}/TaskHeartbeat", Cardinality.UNARY_UNARY, TaskHeartbeatRequest, TaskHeartbeatResponse
                ) as stream:
                    await stream.send_message(req, end=True)
                    reply = await stream.recv_message()
        except _LOST as err:
            log.warning("task heartbeat failed: %s", err)
            return
        self._sent = progress
        if reply is not None and reply.status != self.status:
            log.info("task status: %s", reply.status)
            self.status = reply.status

    async def _upload_stable(self, channel: Any, *, final: bool) -> None:
        """Upload files that stopped changing since the last scan (all of them when ``final``)."""
        if self.status in _TERMINAL and self.status != "COMPLETED" and not final:
            return
        now_seen = await anyio.to_thread.run_sync(_scan, self.config.results_dir)
        for name, stamp in sorted(now_seen.items()):
            if self._uploaded.get(name) == stamp:
                continue
            if not final and self._seen.get(name) != stamp:
                continue  # still being written
            try:
                await self._upload(channel, name, stamp[0])
                self._uploaded[name] = stamp
            except GRPCError as err:
                if err.status not in _REFUSED:
                    log.warning("uploading result %s failed (%s); trying again later", name, err)
                    continue
                # Too large, one result too many: sending it again would be refused again.
                log.error("result %s was refused: %s; it is not uploaded unless it changes", name, err.message)
                self._uploaded[name] = stamp
            except _LOST as err:
                log.warning("uploading result %s failed (%s); trying again later", name, err)
        self._seen = now_seen

    async def _upload(self, channel: Any, name: str, size: int) -> None:
        path = Path(self.config.results_dir) / name
        head = TaskResultChunk(worker_token=self.config.worker_token, name=name, size=size)
        with anyio.fail_after(600):
            async with channel.request(
                f"{SERVICE}/TaskUploadResult", Cardinality.STREAM_UNARY, TaskResultChunk, TaskResultAck
            ) as stream:
                reply = await upload(stream, self._chunks(head, path))
        log.info("uploaded result %s (%d bytes)%s", name, size, f" as {reply.result_id}" if reply else "")

    async def _chunks(self, head: TaskResultChunk, path: Path) -> AsyncIterator[TaskResultChunk]:
        if self._result_handling == "NONE":
            yield head  # the name and size only
            return
        with path.open("rb") as f:
            data = await anyio.to_thread.run_sync(f.read, CHUNK)
            yield _with_data(head, data)
            while data := await anyio.to_thread.run_sync(f.read, CHUNK):
                yield TaskResultChunk(data=data)


def _with_data(head: TaskResultChunk, data: bytes) -> TaskResultChunk:
    return TaskResultChunk(
        worker_token=head.worker_token, name=head.name, size=head.size, metadata_json=head.metadata_json, data=data
    )


def _scan(root: str) -> dict[str, tuple[int, float]]:
    """Regular files under ``root`` (relative names) with their size and mtime."""
    out: dict[str, tuple[int, float]] = {}
    for base, _, files in os.walk(root):
        for file in files:
            path = os.path.join(base, file)
            try:
                st = os.stat(path)
            except OSError:
                continue
            out[os.path.relpath(path, root)] = (st.st_size, st.st_mtime)
    return out
