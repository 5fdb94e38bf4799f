"""What a workload writes to stdout and stderr, sent to its logs telemetry endpoint (OTLP/HTTP).

The local and containers backends keep an instance's output in its ``inference.log``; for an
instance whose function or task chose a logs endpoint, one task per instance reads that file from
where it left off (at most :data:`MAX_READ` a round, complete lines) and posts the lines as OTLP log
records. The file is the buffer: an endpoint that is slow or down holds back only its own
instance's lines (nothing gathers in memory), and each failed post is dropped and said once a
minute in the agent's log. A released instance gets a last round for what it wrote before it ended.

The Kubernetes backend has no file: its task follows the container's log as the cluster streams it
(:meth:`LogShipper.follow`), at most :data:`QUEUED_BYTES` held between rounds (and one line more); a
slow endpoint holds back the stream, not the agent's memory. A Helm function's instance is several
pods: each line carries its pod and container (an :data:`Origin`), sent as resource attributes.

The endpoint is a tenant's: posts connect only to the addresses :mod:`nvcf_mono.contracts.egress`
allows (checked after the name resolves) and follow no redirect. Through the operator's proxy
(``plugins.compute.telemetry_proxy``) the proxy dials: the address in the URL, or what the name resolves
to here, is checked first (:func:`~nvcf_mono.contracts.egress.host_refusal`).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import anyio
import attrs
from anyio.abc import TaskGroup, TaskStatus
from yarl import URL

from nvcf_mono import tracing
from nvcf_mono.contracts import env, trace
from nvcf_mono.contracts.egress import EgressRefused, host_refusal, parse
from nvcf_mono.contracts.telemetry import exports_problem, targets
from nvcf_mono.egress_aiohttp import checked_session, url_refusal
from nvcf_mono.worker.secrets import Source, fetch_secrets, renew_credentials

#: Bytes of a log read and sent per round; a line longer than this goes out in pieces.
MAX_READ = 256 * 1024
#: Seconds between rounds, and the most one post may take.
INTERVAL = 1.0
POST_TIMEOUT = 5.0
#: Seconds between two warnings about one instance's failing posts.
WARN_EVERY = 60.0
#: Bytes of a followed log held between rounds (then the stream waits): a bound per instance however
#: long its lines are.
QUEUED_BYTES = 4 * MAX_READ
#: Seconds a released instance's followed log has to reach its end before its last round.
LAST_WAIT = 2.0


#: Where a followed line comes from within its instance, as resource attributes (a Helm chart's pod and
#: container); () for an instance's one workload.
Origin = tuple[tuple[str, str], ...]
#: A line to send, and where it comes from.
Line = tuple[str, Origin]
#: What a follower hands each line to (it waits while the queue is full).
Put = Callable[[str, Origin], Awaitable[None]]


def logs_target(contract: Mapping[str, str]) -> tracing.OtlpTarget | None:
    """Where an instance's output goes: its function's or task's logs endpoint, if it chose one."""
    raw = contract.get(env.NVCF_TELEMETRY_EXPORTS)
    return targets(raw).get("logs") if raw and exports_problem(raw) is None else None


def resource_of(contract: Mapping[str, str], instance_id: str) -> dict[str, str]:
    """What the records say they come from: the function's or task's name and ids, and the instance."""
    resource = {"service.name": contract.get(env.FUNCTION_NAME) or contract.get(env.NVCT_TASK_NAME) or "workload"}
    for key, variable in (
        (trace.FUNCTION_ID, env.FUNCTION_ID),
        (trace.FUNCTION_VERSION_ID, env.FUNCTION_VERSION_ID),
        (trace.TASK_ID, env.NVCT_TASK_ID),
        (trace.NCA_ID, env.NCA_ID),
    ):
        if contract.get(variable):
            resource[key] = contract[variable]
    resource["service.instance.id"] = instance_id
    return resource


class _Source(Protocol):
    #: Set once there is nothing more to read (a file: at once; a stream: at its end).
    ended: anyio.Event

    async def run(self) -> None:
        """Read in the background (a stream), or nothing (a file)."""

    async def take(self) -> list[Line]:
        """The lines to send now (up to about :data:`MAX_READ` bytes); none when there are none yet."""

    def close(self) -> None:
        """Done with it (what was not taken is dropped)."""


@attrs.define
class _FileLines:
    """An instance's output file, read from where the last round left off."""

    path: Path
    offset: int
    ended: anyio.Event = attrs.Factory(anyio.Event)

    async def run(self) -> None:
        self.ended.set()

    async def take(self) -> list[Line]:
        lines, self.offset = await anyio.to_thread.run_sync(read_lines, self.path, self.offset)
        return [(line, ()) for line in lines]

    def close(self) -> None:
        pass


class _StreamLines:
    """Lines a follower hands over (a container's log as the cluster streams it, or several), queued
    between rounds; the follower waits while :data:`QUEUED_BYTES` are queued.
    """

    def __init__(self, produce: Callable[[Put], Awaitable[None]]) -> None:
        self._produce = produce
        self._queue: deque[Line] = deque()
        self._queued = 0  # bytes
        self._room = anyio.Event()
        self.ended = anyio.Event()

    async def run(self) -> None:
        try:
            await self._produce(self._put)
        finally:
            self.ended.set()

    async def _put(self, line: str, origin: Origin) -> None:
        while self._queued >= QUEUED_BYTES:
            self._room = anyio.Event()
            await self._room.wait()
        self._queue.append((line, origin))
        self._queued += len(line)

    async def take(self) -> list[Line]:
        lines: list[Line] = []
        size = 0
        while self._queue and size < MAX_READ:
            line, origin = self._queue.popleft()
            self._queued -= len(line)
            if line.strip():
                lines.append((line, origin))
                size += len(line)
        self._room.set()
        return lines

    def close(self) -> None:
        self._queue.clear()


@attrs.frozen
class Renewal:
    """How an instance's logs endpoint credentials are asked for again, and how often: a telemetry
    endpoint's secret replaced while the instance runs is sent with from the next round on.
    """

    source: Source
    every: float


@attrs.define
class _Watched:
    instance_id: str
    source: _Source
    target: tracing.OtlpTarget
    resource: dict[str, str]
    renewal: Renewal | None = None
    done: anyio.Event = attrs.Factory(anyio.Event)
    warned_at: float = -WARN_EVERY


def read_lines(path: Path, offset: int) -> tuple[list[str], int]:
    """The complete lines from ``offset`` on (up to :data:`MAX_READ` bytes) and the offset after them.

    A file shorter than ``offset`` was truncated or replaced: read from its start.
    """
    try:
        with path.open("rb") as f:
            size = f.seek(0, 2)
            if size < offset:
                offset = 0
            f.seek(offset)
            chunk = f.read(MAX_READ)
    except OSError:
        return [], offset
    end = chunk.rfind(b"\n") + 1
    if end == 0 and len(chunk) < MAX_READ:
        return [], offset  # a line still being written
    taken = chunk[:end] if end else chunk
    lines = [line.decode(errors="replace") for line in taken.splitlines()]
    return [line for line in lines if line.strip()], offset + len(taken)


def encode(lines: list[Line], resource: Mapping[str, str]) -> bytes:
    """An OTLP ``ExportLogsServiceRequest`` of ``lines``, stamped now: one resource per origin."""
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
    from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, ResourceLogs, ScopeLogs
    from opentelemetry.proto.resource.v1.resource_pb2 import Resource

    now = time.time_ns()
    by_origin: dict[Origin, list[LogRecord]] = {}
    for text, origin in lines:
        record = LogRecord(time_unix_nano=now, observed_time_unix_nano=now, body=AnyValue(string_value=text))
        by_origin.setdefault(origin, []).append(record)
    resource_logs = []
    for origin, records in by_origin.items():
        attributes = [KeyValue(key=k, value=AnyValue(string_value=v)) for k, v in (*resource.items(), *origin)]
        scope = ScopeLogs(log_records=records)
        resource_logs.append(ResourceLogs(resource=Resource(attributes=attributes), scope_logs=[scope]))
    return bytes(ExportLogsServiceRequest(resource_logs=resource_logs).SerializeToString())


class LogShipper:
    """One task per watched instance, in the task group :meth:`run` holds."""

    def __init__(self, log: logging.Logger, proxy: str | None = None) -> None:
        self._log = log
        self._proxy = proxy
        self._tg: TaskGroup | None = None
        self._watched: dict[str, _Watched] = {}
        #: One client per set of allowed networks (in practice one: the control plane's setting).
        self._clients: dict[tuple[str, ...], aiohttp.ClientSession] = {}

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                task_status.started()
                try:
                    await anyio.sleep_forever()
                finally:
                    self._tg = None
        finally:
            clients, self._clients = list(self._clients.values()), {}
            with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                for client in clients:
                    await client.close()

    def _client(self, networks: tuple[str, ...]) -> aiohttp.ClientSession:
        client = self._clients.get(networks)
        if client is None:
            # Through a proxy the proxy resolves and dials: a plain client, and the check before each post.
            fresh = aiohttp.ClientSession(trust_env=False) if self._proxy else checked_session(parse(networks))
            client = self._clients[networks] = fresh
        return client

    def watch(
        self,
        instance_id: str,
        path: Path,
        target: tracing.OtlpTarget,
        resource: Mapping[str, str],
        *,
        from_end: bool,
        renewal: Renewal | None = None,
    ) -> None:
        """Send ``path``'s new lines to ``target`` (``from_end``: only what is written from now on, for an
        instance taken over from an agent that may have sent the rest).
        """
        try:
            offset = path.stat().st_size if from_end else 0
        except OSError:
            offset = 0
        self._start(instance_id, _FileLines(path, offset), target, resource, renewal)

    def follow(
        self,
        instance_id: str,
        produce: Callable[[Put], Awaitable[None]],
        target: tracing.OtlpTarget,
        resource: Mapping[str, str],
        *,
        renewal: Renewal | None = None,
    ) -> None:
        """Send the lines ``produce`` hands to the :data:`Put` it is given to ``target``, a round's worth at a
        time, until :meth:`forget`.
        """
        self._start(instance_id, _StreamLines(produce), target, resource, renewal)

    def _start(
        self,
        instance_id: str,
        source: _Source,
        target: tracing.OtlpTarget,
        resource: Mapping[str, str],
        renewal: Renewal | None,
    ) -> None:
        if self._tg is None or instance_id in self._watched:
            return
        if not tracing.installed():
            self._log.warning("instance %s: its output is not sent: OpenTelemetry is not installed", instance_id)
            return
        watched = _Watched(
            instance_id, source, target, dict(resource), renewal if renewal and renewal.every > 0 else None
        )
        self._watched[instance_id] = watched
        self._tg.start_soon(self._ship, watched, name=f"log shipping {instance_id}")

    def forget(self, instance_id: str) -> None:
        """Stop after one last round (what the instance wrote before it ended goes out)."""
        watched = self._watched.pop(instance_id, None)
        if watched is not None:
            watched.done.set()

    async def _ship(self, w: _Watched) -> None:
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(w.source.run)
                if w.renewal is not None:
                    tg.start_soon(self._renew, w, w.renewal)
                while True:
                    with anyio.move_on_after(INTERVAL):
                        await w.done.wait()
                    last = w.done.is_set()
                    if last:
                        with anyio.move_on_after(LAST_WAIT):  # what the stream still brings
                            await w.source.ended.wait()
                    while lines := await w.source.take():  # everything there now, a read at a time
                        await self._post(w, lines)
                    if last:
                        tg.cancel_scope.cancel()
                        return
        except Exception:  # a fault here ends this instance's shipping, never the agent
            self._log.exception("instance %s: sending its output to its logs endpoint stopped", w.instance_id)
        finally:
            w.source.close()
            if self._watched.get(w.instance_id) is w:
                del self._watched[w.instance_id]

    async def _renew(self, w: _Watched, renewal: Renewal) -> None:
        """Ask for the instance's telemetry credentials every ``renewal.every`` seconds; a failed ask keeps
        the current ones until the next. (A backend that asks for the instance's secrets anyway passes
        no renewal and calls :meth:`renew` with what it got.)
        """
        while True:
            await anyio.sleep(renewal.every)
            try:
                fetched = await fetch_secrets(renewal.source)
            except Exception as err:  # grpclib's errors, OSError, a timeout: all mean "not now"
                self._log.debug("instance %s: cannot ask for its telemetry credentials: %s", w.instance_id, err)
                continue
            self.renew(w.instance_id, fetched.telemetry_exports)

    def renew(self, instance_id: str, telemetry_exports: str | None) -> None:
        """Send the instance's output with the logs credentials ``telemetry_exports`` (``NVCF_TELEMETRY_EXPORTS``
        as the platform answers it now) names, from the next post on.
        """
        w = self._watched.get(instance_id)
        if w is not None and renew_credentials({"logs": w.target}, telemetry_exports):
            self._log.info(
                "instance %s: its logs endpoint's secret was replaced: sending with the new one", instance_id
            )

    async def _post(self, w: _Watched, lines: list[Line]) -> None:
        headers = {**w.target.credentials.current(), "Content-Type": "application/x-protobuf"}
        networks = w.target.networks or ()
        try:
            allowed = parse(networks)
            if self._proxy:
                why = await host_refusal(URL(w.target.url).host or "", allowed)
            else:
                why = url_refusal(w.target.url, allowed)  # aiohttp does not ask the resolver for an address
            if why is not None:
                raise EgressRefused(why)
            with anyio.fail_after(POST_TIMEOUT):
                # The answer's body is never read: a tenant's endpoint could send any amount.
                async with self._client(networks).post(
                    w.target.url,
                    data=encode(lines, w.resource),
                    headers=headers,
                    allow_redirects=False,
                    proxy=self._proxy,
                ) as resp:
                    problem: Any = None if resp.status < 300 else f"HTTP {resp.status}"
        except (aiohttp.ClientError, TimeoutError, OSError) as err:
            problem = f"{type(err).__name__}: {err}"
        if problem is not None and time.monotonic() - w.warned_at >= WARN_EVERY:
            w.warned_at = time.monotonic()
            self._log.warning(
                "instance %s: its output could not be sent to its logs endpoint %s (%d lines dropped): %s",
                w.instance_id,
                w.target.url,
                len(lines),
                problem,
            )
