"""The worker's life: wait for a healthy inference server, connect, serve, reconnect, drain.

One Serve stream to the invocation plane; each request it delivers runs in its own task (never more
than ``MAX_REQUEST_CONCURRENCY`` at once, the node sees to that), its frames go back up the same
stream. Cancel messages stop a request's call to the inference server. While the inference server
fails its health checks the worker tells the node it is not ready (no new work) and its own
``/v1/health/ready`` says 503. A lost connection is retried with backoff.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import zipfile
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from functools import partial
from typing import IO, TYPE_CHECKING, final

import anyio
import attrs
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectSendStream
from grpclib.client import Channel
from grpclib.const import Cardinality
from grpclib.const import Status as GRPCStatus
from grpclib.exceptions import GRPCError, ProtocolError, StreamTerminatedError

from nvcf_mono import tracing
from nvcf_mono.backoff import Backoff
from nvcf_mono.bus.holding import hold_until_ready
from nvcf_mono.contracts import live_input, redelivery, subjects, trace
from nvcf_mono.contracts.frames import Frame, FrameError, Request
from nvcf_mono.contracts.problems import INFERENCE_CONNECTION, WORKER_SERVICE
from nvcf_mono.grpc.batch import MOST, STREAM_GONE, accept_large_frames, send_all
from nvcf_mono.grpc.uploads import upload as upload_all
from nvcf_mono.log import bind, unbind
from nvcf_mono.metrics import Metrics
from nvcf_mono.proto.gen.nvcf.worker.v1 import (
    BodyChunk,
    BodyRequest,
    ConnectRequest,
    ConnectResponse,
    Drain,
    LargeResponseChunk,
    LargeResponseStored,
    RequestFailed,
    WorkerHello,
    WorkerMessage,
    WorkerStatus,
)
from nvcf_mono.proto.serve_wire import NODE_STOPPING, NodeEnvelope, WorkerEnvelope
from nvcf_mono.queues import batches
from nvcf_mono.settlement import Policy, Settlement
from nvcf_mono.worker import endpoint
from nvcf_mono.worker.assets import AssetDownloadError, download_assets
from nvcf_mono.worker.config import WorkerConfig
from nvcf_mono.worker.grpc_relay import grpc_call
from nvcf_mono.worker.http1 import BadResponse, Http1Client
from nvcf_mono.worker.inference import (
    InferenceCrashed,
    InferenceUnreachable,
    call,
    check_health,
    compatible,
    health_client,
    problem_frame,
    request_headers,
)
from nvcf_mono.worker.large_output import CHUNK as LARGE_CHUNK
from nvcf_mono.worker.large_output import gather, has_outputs, over_direct_limit, package, unsized
from nvcf_mono.worker.live_input import NodeInputs
from nvcf_mono.worker.nats_transport import WorkerSink
from nvcf_mono.worker.progress import PROGRESS_FILE, ProgressMonitor, ProgressReports
from nvcf_mono.worker.scratch import Scratch
from nvcf_mono.worker.slots import Slots
from nvcf_mono.worker.telemetry import InstanceTelemetry

if TYPE_CHECKING:
    from nvcf_mono.bus.api import Bus, Consumer, Delivery

SERVICE = "/nvcf.worker.v1.WorkerService"
log = logging.getLogger("nvcf_mono.worker")
#: Longest a large response's upload to the node may take, all of it.
LARGE_UPLOAD_TIMEOUT = 600.0
#: In an output directory but not an output: the progress file the worker reads itself.
_NOT_OUTPUTS = frozenset({PROGRESS_FILE})
#: The session's own end, met while answering: it ends the session, not only the request.
_SESSION_GONE = (anyio.BrokenResourceError, anyio.ClosedResourceError)
#: A request that finds the inference server down waits at least this long for it to come back
#: (up to the request's queue deadline) before it is handed back for another instance.
RECOVERY_WAIT = 30.0
#: A session that lasted this long was a good one: the next failure starts the backoff afresh.
STABLE_SESSION = 10.0
#: How long a drained worker waits for the node to end the session.
DRAIN_GRACE = 10.0
#: Serving tasks kept waiting for the next request at most (``slots.Slots``): enough for the swings of a
#: busy instance's requests in flight, few enough that a burst's tasks go away after it.
SPARE_TASKS = 32

Out = MemoryObjectSendStream[WorkerEnvelope]
#: What a lost connection to the node raises (a broken internal stream is the same session ending).
LOST = (
    GRPCError,
    StreamTerminatedError,
    ProtocolError,
    OSError,
    ConnectionError,
    TimeoutError,
    anyio.BrokenResourceError,
)


def _node_stopping(err: BaseException) -> bool:
    return isinstance(err, GRPCError) and err.status is GRPCStatus.UNAVAILABLE and err.message == NODE_STOPPING


@attrs.frozen
class _Link:
    """What a request needs of its session: the channel, the session token, the way up, HTTP."""

    channel: Channel
    session: ConnectResponse
    out: Out
    http: Http1Client
    #: nats transport: the worker's own NATS connection.
    bus: Bus | None = None


@final
@attrs.define
class _PullUnderWay:
    """The nats transport's pull of the moment, which a drain or its node's leaving ends."""

    scope: anyio.CancelScope | None = None
    consumer: Consumer | None = None

    def end(self) -> None:
        """Stop the consumer first, so nothing the server sent it waits out ack_wait; then the pull."""
        if self.consumer is not None:
            self.consumer.stop()
        if self.scope is not None:
            self.scope.cancel()


@final
class WorkerState:
    """What the health endpoints report."""

    def __init__(self) -> None:
        self.inference_healthy = False
        self.connected = False
        self.draining = False
        #: Why the inference server is not healthy ("" when it is).
        self.inference_detail = "waiting for the inference server"
        #: Why the worker is not connected ("" when it is).
        self.connection_detail = ""
        self._in_flight = 0
        self._busy = 0.0
        self._since = time.monotonic()
        self.served = 0
        #: Sessions opened with the invocation plane (more than one: it reconnected).
        self.sessions = 0

    @property
    def ready(self) -> bool:
        return self.inference_healthy and self.connected and not self.draining

    @property
    def in_flight(self) -> int:
        """Requests being served now."""
        return self._in_flight

    @in_flight.setter
    def in_flight(self, value: int) -> None:
        now = time.monotonic()
        self._busy += self._in_flight * (now - self._since)
        self._since = now
        self._in_flight = value

    @property
    def busy_seconds(self) -> float:
        """Slot-seconds spent serving since the worker started (what the autoscaler's utilization counts)."""
        return self._busy + self._in_flight * (time.monotonic() - self._since)

    @property
    def detail(self) -> str:
        return "; ".join(d for d in (self.inference_detail, self.connection_detail) if d)


@final
class Worker:
    """Runs until cancelled or drained."""

    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        self.state = WorkerState()
        self._cancels: dict[str, anyio.CancelScope] = {}
        self._inputs = NodeInputs()
        self._health_changed = anyio.Event()
        #: Set while the inference server is healthy.
        self._healthy = anyio.Event()
        #: Set whenever nothing is in flight (draining waits for it).
        self._idle = anyio.Event()
        self._idle.set()
        self._drain = anyio.Event()
        #: Why the node of the current session said it ends it (it stops), if it did.
        self._left_because: str | None = None
        #: Draining is over: the way up is closed, requests that still arrive are left to the node.
        self._closing = False
        self.backoff = Backoff()
        self.progress = ProgressMonitor(config.progress_interval)
        #: Requests' output directories (recycled) and input asset directories (removed after). Spares
        #: come back a clearing batch later, so enough are kept for a batch's worth of requests.
        self.outputs = Scratch(
            config.response_dir, keep=max(256, 4 * config.max_concurrency), on_left=self._outputs_left
        )
        self.asset_dirs = Scratch(config.asset_dir, keep=0)
        #: Output directories whose files went to the caller as a large response (not "left behind"),
        #: until they are released.
        self._packaged: set[str] = set()
        self._warned_left = False
        #: nats transport: requests pulled from JetStream and not settled yet.
        self._held: dict[str, Settlement] = {}
        #: The function's telemetry endpoints (metrics per request), when it has any (``worker/main.py``).
        self.telemetry: InstanceTelemetry | None = None

    def _outputs_left(self, path: str) -> None:
        """Say once that files a request left in its output directory did not go to its caller."""
        if path in self._packaged:
            self._packaged.discard(path)
            return
        if self._warned_left:
            return
        try:
            with os.scandir(path) as entries:
                names = sorted(e.name for e in entries if e.name != PROGRESS_FILE)
        except OSError:
            return
        if names:
            self._warned_left = True  # once per worker: a function that writes there does it every time
            log.warning(
                "request %s left %d file(s) in its output directory (NVCF-LARGE-OUTPUT-DIR), e.g. %s, that did "
                "not go to its caller: only what is there when the response starts is packaged (in compatibility "
                "mode); they are removed. Said once per instance",
                os.path.basename(path),
                len(names),
                ", ".join(names[:3]),
            )

    def request_drain(self) -> None:
        """Finish what is held, take nothing new, then stop."""
        self.state.draining = True
        self._drain.set()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        for base in (self.config.asset_dir, self.config.response_dir):
            os.makedirs(base, exist_ok=True)
        async with (
            health_client(self.config) as http,
            Http1Client(
                self.config.inference_host, self.config.inference_port, connect_timeout=self.config.health_timeout
            ) as calls,
        ):
            await self._wait_healthy(http)
            task_status.started()
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._watch_health, http)
                tg.start_soon(self.progress.run)
                tg.start_soon(self.outputs.run)
                tg.start_soon(self.asset_dirs.run)
                await self._serve_forever(calls)
                tg.cancel_scope.cancel()

    # ---- health of the inference server ---------------------------------------------------------

    async def _wait_healthy(self, http: Http1Client) -> None:
        deadline = time.monotonic() + self.config.ready_timeout
        # The server usually starts beside the worker: checked often at first (a cold start waits on
        # this), then every half second at most.
        pause = Backoff(0.02, min(self.config.health_interval, 0.5), factor=1.5, jitter=0.1)
        while True:
            healthy, why = await check_health(http, self.config)
            if healthy:
                self._set_health(True, "")
                return
            self.state.inference_detail = why
            if time.monotonic() > deadline:
                raise TimeoutError(f"the inference server was not healthy within {self.config.ready_timeout:g}s: {why}")
            await anyio.sleep(pause.next())

    async def _watch_health(self, http: Http1Client) -> None:
        while True:
            await anyio.sleep(self.config.health_interval)
            healthy, why = await check_health(http, self.config)
            self._set_health(healthy, why)

    def _set_health(self, healthy: bool, why: str) -> None:
        """Record the inference server's health; a change is reported to the node (pause / resume)."""
        if healthy:
            self._healthy.set()
        elif self._healthy.is_set():
            self._healthy = anyio.Event()
        self.state.inference_detail = why
        if healthy != self.state.inference_healthy:
            log.info("inference server %s%s", "healthy" if healthy else "unhealthy: ", why)
            self.state.inference_healthy = healthy
            self._health_changed.set()

    async def _until_healthy(self, request: Request) -> bool:
        """Wait for a healthy inference server (until the request's deadline, at least RECOVERY_WAIT)."""
        if self.state.inference_healthy:
            return True
        budget = max(request.deadline_ms / 1000 - time.time(), RECOVERY_WAIT)
        with anyio.move_on_after(budget):
            await self._healthy.wait()
            return True
        return False

    # ---- the connection to the invocation plane --------------------------------------------------

    async def _serve_forever(self, http: Http1Client) -> None:
        while not self._drain.is_set():
            connected_at: float | None = None
            why = "the invocation node ended the session"
            try:
                async with endpoint.channel(self.config) as channel:
                    session = await self._connect(channel)
                    connected_at = time.monotonic()
                    self.state.sessions += 1
                    await self._serve(channel, session, http)
            except* LOST as group:  # raised inside the session's task groups: maybe grouped
                err = _first(group)
                why = f"{type(err).__name__}: {err}"
                if _node_stopping(err):
                    why = NODE_STOPPING
            told, self._left_because = self._left_because, None
            if told is not None:  # the node said why first: what followed (an end, a reset) is that
                why = told
            self.state.connected = False
            if self._drain.is_set():
                return
            if connected_at is not None and (told is not None or time.monotonic() - connected_at >= STABLE_SESSION):
                # A session that lasted, or one its node ended in order (a rolling restart): nothing to
                # back off from, so the next node is dialled at once rather than after earlier failures' delay.
                self.backoff.reset()
            delay = self.backoff.next()
            self.state.connection_detail = f"not connected to the invocation plane ({why})"
            # A node that stops says so: expected in a rolling restart, not a fault.
            level = logging.INFO if why in (NODE_STOPPING, told) else logging.WARNING
            log.log(level, "connection to the invocation plane lost (%s); retrying in %.1fs", why, delay)
            with anyio.move_on_after(delay):
                await self._drain.wait()

    async def _connect(self, channel: Channel) -> ConnectResponse:
        with anyio.fail_after(30):
            async with channel.request(
                f"{SERVICE}/ConnectOnce", Cardinality.UNARY_UNARY, ConnectRequest, ConnectResponse
            ) as stream:
                await stream.send_message(
                    ConnectRequest(
                        worker_token=self.config.worker_token,
                        instance_id=self.config.instance_id,
                        max_concurrency=self.config.max_concurrency,
                        transports=["nats", "grpc"],
                    ),
                    end=True,
                )
                reply = await stream.recv_message()
                if reply is None:
                    raise ConnectionError("ConnectOnce ended without an answer")
                return reply

    async def _serve(self, channel: Channel, session: ConnectResponse, http: Http1Client) -> None:
        # The hot messages (requests down, frames up) use the Serve stream's fast codec.
        async with channel.request(
            f"{SERVICE}/Serve", Cardinality.STREAM_STREAM, WorkerEnvelope, NodeEnvelope
        ) as stream:
            hello = WorkerHello(
                session_token=session.session_token,
                instance_id=self.config.instance_id,
                max_concurrency=self.config.max_concurrency,
            )
            await stream.send_message(WorkerEnvelope(message=WorkerMessage(hello=hello)))
            accept_large_frames(stream)
            self.state.connected = True
            self.state.connection_detail = ""
            log.info("serving function %s version %s", self.config.function_id, self.config.function_version_id)
            if not self.state.inference_healthy:
                self._health_changed.set()  # a new session starts ready: say at once that it is not
            send, recv = anyio.create_memory_object_stream[WorkerEnvelope](self.config.max_concurrency * 4 + 16)
            link = _Link(channel, session, send, http)
            ended_by_node = False
            async with send, recv, anyio.create_task_group() as tg:  # recv too: the sender may never start

                async def sender() -> None:
                    async with recv:
                        async for batch in batches(recv, MOST):
                            await send_all(stream, batch)
                    await stream.end()  # drained: the node ends the session when it sees this

                tg.start_soon(sender)
                tg.start_soon(self._report_health, send, session.status_interval_ms / 1000)
                tg.start_soon(self._drain_on_request, send, tg.cancel_scope)
                async with anyio.create_task_group() as requests:
                    slots = Slots(requests, spare=SPARE_TASKS)
                    leaving = anyio.Event()  # the node said it is stopping: pull no more through it
                    if session.transport == "nats":
                        requests.start_soon(self._pull_nats, session, link, slots, leaving)
                    while True:
                        envelope = await stream.recv_message()
                        if envelope is None:
                            # The node ended the session; it has handed what we held to others.
                            requests.cancel_scope.cancel()
                            ended_by_node = True
                            break
                        if envelope.request is not None:
                            self._start(slots, envelope.request, envelope.attempt, link)
                        elif envelope.kind == "cancel":
                            assert envelope.message is not None
                            held = self._cancels.get(envelope.message.cancel.request_id)
                            if held is not None:
                                held.cancel()
                        elif envelope.kind == "input":
                            assert envelope.message is not None
                            self._inputs.arrived(envelope.message.input)
                        elif envelope.kind == "leave":
                            assert envelope.message is not None
                            self._left_because = envelope.message.leave.reason or NODE_STOPPING
                            leaving.set()
                tg.cancel_scope.cancel()
            if ended_by_node:  # our side ends too, or grpclib finds the call unfinished as it closes it
                with contextlib.suppress(*STREAM_GONE):
                    await stream.end()
            self.state.connected = False

    def _start(self, slots: Slots, blob: bytes, attempt: int, link: _Link) -> None:
        try:
            request = Request.decode(blob)
        except FrameError as err:
            log.error("the node sent a malformed request: %s", err)
            return
        if self._closing:
            log.info("request %s arrived after draining; the node gives it to another instance", request.request_id)
            return
        # Registered before the task runs, so that a cancel arriving right after finds it.
        scope = self._cancels[request.request_id] = anyio.CancelScope()
        self.state.in_flight += 1
        if self._idle.is_set():
            self._idle = anyio.Event()
        slots.hand(partial(self._handle, request, scope, attempt, link))

    async def _report_health(self, out: Out, interval: float) -> None:
        """A status when health changes, and every ``interval`` (the load the autoscaler reads)."""
        while True:
            with anyio.move_on_after(interval if interval > 0 else float("inf")):
                await self._health_changed.wait()
            self._health_changed = anyio.Event()
            status = WorkerStatus(
                ready=self.state.inference_healthy,
                in_flight=self.state.in_flight,
                max_concurrency=self.config.max_concurrency,
                detail=self.state.inference_detail,
                busy_seconds=self.state.busy_seconds,
            )
            try:
                await out.send(WorkerEnvelope(message=WorkerMessage(status=status)))
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                return  # drained

    async def _drain_on_request(self, out: Out, session: anyio.CancelScope) -> None:
        """Tell the node to send nothing more, finish what is held, then end the session."""
        await self._drain.wait()
        await out.send(WorkerEnvelope(message=WorkerMessage(drain=Drain(reason="the worker is stopping"))))
        while self.state.in_flight:
            await self._idle.wait()
        self._closing = True
        out.close()  # the sender ends the stream once everything before is sent
        await anyio.sleep(DRAIN_GRACE)
        log.warning("the invocation node did not end the session within %gs of the drain", DRAIN_GRACE)
        session.cancel()

    # ---- the nats transport -----------------------------------------------------------------------

    async def _pull_nats(self, session: ConnectResponse, link: _Link, slots: Slots, leaving: anyio.Event) -> None:
        """Pull the version's durable directly; pause while unhealthy, stop on drain or when the session's
        node leaves (what was pulled is still served and settled; the next session pulls again).
        """
        # Only this transport needs NATS: importing its client and the bus settings is about a fifth of
        # the worker's imports (0.1 s here), and the worker's start is on every cold start's path.
        from nvcf_mono.bus.nats import open_nats_bus
        from nvcf_mono.config.model import BusSettings

        settings = BusSettings(connect_retry_for=30.0, request_timeout=10.0, reconnect_wait=0.5)
        name = f"worker_{self.config.function_version_id}_{self.config.instance_id}"

        async def up(envelope: WorkerEnvelope) -> None:
            await link.out.send(envelope)

        async with open_nats_bus(
            settings,
            servers=[u.strip() for u in session.nats_url.split(",") if u.strip()],
            name=name,
            metrics=Metrics(),
            log=log,
            token=session.nats_token,
            inbox_prefix=session.nats_inbox_prefix,
        ) as bus:
            log.info("pulling requests from NATS (%s)", session.durable)
            link = attrs.evolve(link, bus=bus)  # a live gRPC call's client stream is asked for over it
            stream = bus.stream(session.stream)
            concurrency = max(1, session.max_concurrency or self.config.max_concurrency)
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._nats_cancels, bus, session.cancel_subject)
                keep = max(1.0, (session.ack_wait_seconds or 30) / 3)
                tg.start_soon(self._nats_keepalive, keep)
                stopped = anyio.Event()
                pull = _PullUnderWay()
                tg.start_soon(self._stop_pulling, (self._drain, leaving), stopped, pull)
                while not stopped.is_set():
                    with anyio.CancelScope() as pull.scope:
                        pull.consumer = None
                        await self._healthy.wait()
                        async with stream.consume(
                            session.durable, batch=concurrency, max_inflight=concurrency, fetch_timeout=5.0
                        ) as deliveries:
                            pull.consumer = deliveries
                            async for delivery in deliveries:
                                if not self.state.inference_healthy and not stopped.is_set():
                                    await hold_until_ready(
                                        lambda: self._healthy, delivery, within=redelivery.PAUSED_HOLD, keepalive=keep
                                    )
                                if not self.state.inference_healthy or stopped.is_set():
                                    await delivery.nak()  # still paused, or stopping: another instance takes it
                                    break
                                self._take(delivery, bus=bus, session=session, link=link, slots=slots, up=up)
                # Stopped: what was pulled is answered and acked over this connection, so it stays open
                # (and kept alive, and cancellable) until nothing is in flight.
                while self.state.in_flight:
                    await self._idle.wait()
                tg.cancel_scope.cancel()

    def _take(
        self,
        delivery: Delivery,
        *,
        bus: Bus,
        session: ConnectResponse,
        link: _Link,
        slots: Slots,
        up: Callable[[WorkerEnvelope], Awaitable[None]],
    ) -> None:
        try:
            request = Request.decode(delivery.data)
        except FrameError as err:
            log.error("dropping a malformed request: %s", err)
            slots.hand(delivery.term)
            return
        scope = self._cancels[request.request_id] = anyio.CancelScope()
        policy = Policy(max_deliver=session.max_deliver or 3)
        held = Settlement(delivery, request, policy=policy, sink=WorkerSink(bus, up))
        self._held[request.request_id] = held
        self.state.in_flight += 1
        if self._idle.is_set():
            self._idle = anyio.Event()
        slots.hand(partial(self._serve_pulled, held, scope, link, up))

    async def _serve_pulled(
        self, held: Settlement, scope: anyio.CancelScope, link: _Link, up: Callable[[WorkerEnvelope], Awaitable[None]]
    ) -> None:
        """A request this worker pulled itself: its node knows it holds it until it is settled."""
        rid = held.request.request_id
        await up(WorkerEnvelope(held=(rid, held.delivery.ack_subject)))
        try:
            if await held.refused_on_arrival():
                self._held.pop(rid, None)
                self._cancels.pop(rid, None)
                self._finished()
            else:
                await self._handle(held.request, scope, held.attempt, link, held)
        finally:
            with (
                anyio.CancelScope(shield=True),
                anyio.move_on_after(5),
                contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError),
            ):
                # A drain may have closed the way up once nothing was in flight: the node learns of the
                # end of what it held from the session's end then.
                await up(WorkerEnvelope(released=rid))

    def _finished(self) -> None:
        self.state.in_flight -= 1
        self.state.served += 1
        if not self.state.in_flight:
            self._idle.set()

    @staticmethod
    async def _stop_pulling(events: tuple[anyio.Event, ...], stopped: anyio.Event, pull: _PullUnderWay) -> None:
        """When the first of ``events`` is set: set ``stopped`` and end the pull under way (one watcher
        for the whole connection, however often the pull pauses).
        """
        async with anyio.create_task_group() as race:
            for event in events:

                async def first(event: anyio.Event = event) -> None:
                    await event.wait()
                    race.cancel_scope.cancel()

                race.start_soon(first)
        stopped.set()
        pull.end()

    async def _nats_cancels(self, bus: Bus, subject: str) -> None:
        async with bus.subscribe(subject) as sub:
            async for msg in sub:
                request_id = msg.data.decode(errors="replace")
                scope = self._cancels.get(request_id)
                held = self._held.get(request_id)
                if held is not None:
                    await held.cancelled()  # the client is gone: nobody wants it any more
                if scope is not None:
                    scope.cancel()

    async def _nats_keepalive(self, interval: float) -> None:
        while True:
            await anyio.sleep(interval)
            for held in list(self._held.values()):
                await held.keep_alive()

    # ---- one request ------------------------------------------------------------------------------

    async def _handle(
        self, request: Request, scope: anyio.CancelScope, attempt: int, link: _Link, held: Settlement | None = None
    ) -> None:
        rid = request.request_id
        asset_dir = os.path.join(self.config.asset_dir, rid)
        output_dir = os.path.join(self.config.response_dir, rid)
        token = bind(rid, request.function_id, request.function_version_id)  # named in every log line
        span = (
            tracing.start(
                "serve",
                parent=tracing.extract(request.headers),
                kind="consumer",
                **{trace.REQUEST_ID: rid, trace.ATTEMPT: attempt, trace.INSTANCE_ID: self.config.instance_id},
            )
            if tracing.enabled()
            else None
        )
        try:
            with scope:
                await self._serve_request(
                    request, attempt, link, asset_dir=asset_dir, output_dir=output_dir, held=held, span=span
                )
        finally:
            tracing.end(span)
            if held is not None:
                self._held.pop(rid, None)
                if not held.settled:  # cancelled or interrupted: let another instance have it now
                    with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                        await held.give_back()
            self._cancels.pop(rid, None)
            self._finished()
            self.outputs.release(output_dir)
            if request.asset_ids:
                self.asset_dirs.release(asset_dir)
            unbind(token)

    async def _serve_request(
        self,
        request: Request,
        attempt: int,
        link: _Link,
        *,
        asset_dir: str,
        output_dir: str,
        held: Settlement | None = None,
        span: tracing.Span | None = None,
    ) -> None:
        rid = request.request_id
        received = time.perf_counter()
        reply = _Reply(rid, link.out, held, stop=lambda: self._cancels.get(rid, anyio.CancelScope()).cancel())
        try:
            answer, failed = reply.answer, reply.failed

            def internal_error(detail: str) -> Frame:
                return problem_frame(rid, attempt, 500, detail, source=WORKER_SERVICE)

            try:
                headers = await self._prepare(request, link, asset_dir=asset_dir, output_dir=output_dir)
            except _NotPrepared as err:
                await answer(internal_error(str(err)))
                return
            for last_try in (False, True):
                if not await self._until_healthy(request):
                    await failed(f"the inference server was not healthy: {self.state.inference_detail}")
                    return
                try:
                    await self._call_once(
                        request,
                        attempt,
                        link,
                        headers,
                        output_dir=output_dir,
                        answer=answer,
                        received=received,
                        span=span,
                    )
                    return
                except InferenceUnreachable as err:
                    # Nothing reached the server: once it is back (restarted), trying again is safe.
                    self._set_health(False, str(err))
                    if last_try:
                        log.warning("request %s: %s", rid, err)
                        await failed(str(err))
                except InferenceCrashed as err:
                    log.warning("request %s: the inference server failed: %s", rid, err)
                    self._set_health(False, f"the inference server failed during a request: {err}")
                    await failed(str(err))
                    return
                except (BadResponse, TimeoutError) as err:
                    log.warning("request %s: calling the inference server failed: %s", rid, err)
                    if reply.answered:  # part of the answer went out: its node ends it (a 502 mid-response)
                        await failed(f"the inference server's answer broke off: {type(err).__name__}: {err}")
                        return
                    detail = "Inference connection error while making inference request"
                    await answer(problem_frame(rid, attempt, 500, detail, source=INFERENCE_CONNECTION))
                    return
                except _SESSION_GONE:
                    raise
                except Exception as err:
                    # A fault of the worker's own: this request fails, the session and its other requests go on.
                    log.exception("request %s: the worker failed serving it", rid)
                    reason = f"the worker failed serving the request: {type(err).__name__}: {err}"
                    if reply.answered:
                        await failed(reason)  # part of the answer went out: another instance tries it whole
                    else:
                        await answer(internal_error(reason))
                    return
        finally:
            if self.telemetry is not None:
                self.telemetry.record(time.perf_counter() - received, reply.status)

    async def _call_once(
        self,
        request: Request,
        attempt: int,
        link: _Link,
        headers: dict[str, str],
        *,
        output_dir: str,
        answer: Callable[[Frame], Awaitable[None]],
        received: float,
        span: tracing.Span | None,
    ) -> None:
        """Call the inference server once and relay its response (traced as ``call <method>``)."""
        body: bytes | AsyncIterable[bytes] = (
            request.body if request.body_object is None else self._body(link.channel, link.session, request)
        )
        calling = None
        if tracing.enabled():
            calling = tracing.start(f"call {request.method}", parent=span, kind="client", **{"url.path": request.path})
            headers = dict(tracing.replace_context(headers.items(), calling))  # the server's spans join under it
        try:
            if request.grpc:
                more = self._more_input(request, link) if request.live_input else None
                await grpc_call(self.config, request, body, attempt=attempt, answer=answer, more=more)
            elif request.streaming:
                frames = call(link.http, self.config, request, body, headers, attempt=attempt, received=received)
                await _relay(frames, answer)
            else:
                frames = call(link.http, self.config, request, body, headers, attempt=attempt, received=received)
                await self._with_progress(frames, request, attempt, output_dir=output_dir, answer=answer, link=link)
        except BaseException as err:
            tracing.end(calling, error=f"{type(err).__name__}: {err}")
            raise
        tracing.end(calling)

    def _more_input(self, request: Request, link: _Link) -> Callable[[int], Awaitable[bytes]]:
        """How a live gRPC call asks for its client's later messages: over the worker's own NATS
        connection (nats transport), else through its node.
        """
        if link.bus is not None:
            return partial(live_input.fetch, link.bus, subjects.input_subject(request.reply))
        return partial(self._inputs.fetch, link.out, request.request_id)

    async def _prepare(self, request: Request, link: _Link, *, asset_dir: str, output_dir: str) -> dict[str, str]:
        """The request's output directory and assets, and the headers the inference server gets (raises
        _NotPrepared with what the client is told).
        """
        rid = request.request_id
        try:
            self.outputs.make(request.request_id)
        except OSError as err:
            log.error("request %s: cannot create %s: %s", rid, output_dir, err)
            raise _NotPrepared("Internal error while preparing for inference") from err
        if request.asset_ids:
            try:
                await download_assets(link.channel, link.session, request, asset_dir)
            except AssetDownloadError as err:
                log.warning("request %s: failed to download assets: %s", rid, err)
                raise _NotPrepared("Internal error while downloading assets") from err
        headers = request_headers(
            self.config,
            request,
            asset_dir=os.path.join(self.config.inference_asset_dir, rid),
            output_dir=os.path.join(self.config.inference_response_dir, rid),
        )
        if request.body_object is not None:
            headers["Content-Length"] = str(request.body_size)  # streamed from the store, length known
        return headers

    async def _with_progress(
        self,
        frames: AsyncIterator[Frame],
        request: Request,
        attempt: int,
        *,
        output_dir: str,
        answer: Callable[[Frame], Awaitable[None]],
        link: _Link,
    ) -> None:
        """Relay the response; until it starts, progress reports go out as 202 frames before it.

        In compatibility mode, a request that left files in its output directory by the time its
        response starts, or whose body is over the direct limit (declared, or read whole when its
        length is unknown), is answered with a 302 to a zip of the response and the files (NVCF's
        large response).
        """
        rid = request.request_id
        progress = ProgressReports(rid, attempt, os.path.join(output_dir, PROGRESS_FILE))
        self.progress.watch(progress, answer)
        try:
            offset: int | None = None
            async for frame in frames:
                if offset is None:
                    offset = await progress.close()
                    self.progress.drop(rid)
                    # NVCF's large response concerns a successful answer in compatibility mode only: an
                    # error goes to the caller as it is.
                    if 200 <= (frame.status or 200) < 300 and compatible(request):
                        if unsized(frame):
                            frame = await gather(frame, frames)  # its size decides how it goes
                        if self._large(output_dir, frame):
                            frame = await self._large_response(
                                frame, frames, request, attempt=attempt, output_dir=output_dir, link=link
                            )
                # The response's frames are numbered after the progress reports.
                await answer(attrs.evolve(frame, seq=frame.seq + offset) if offset else frame)
        finally:
            self.progress.drop(rid)

    def _large(self, output_dir: str, first: Frame) -> bool:
        """NVCF's large response: a body over the direct limit (declared, or read by :func:`gather` when
        its length is unknown), or a request that wrote files for the caller (a progress file aside).
        """
        if over_direct_limit(first):
            return True
        return not self.outputs.untouched(output_dir) and has_outputs(output_dir, besides=_NOT_OUTPUTS)

    async def _large_response(
        self,
        first: Frame,
        rest: AsyncIterator[Frame],
        request: Request,
        *,
        attempt: int,
        output_dir: str,
        link: _Link,
    ) -> Frame:
        """The response and the request's files, zipped and uploaded: the 302 to them, or a 500 problem."""
        rid = request.request_id

        async def upload(archive: IO[bytes]) -> str:
            with anyio.fail_after(LARGE_UPLOAD_TIMEOUT):
                return await send(archive)

        async def chunks(archive: IO[bytes]) -> AsyncIterator[LargeResponseChunk]:
            data = await anyio.to_thread.run_sync(archive.read, LARGE_CHUNK)
            yield LargeResponseChunk(
                session_token=link.session.session_token,
                request_id=rid,
                capability=subjects.response_capability(request.reply),
                data=data,
            )
            while data := await anyio.to_thread.run_sync(archive.read, LARGE_CHUNK):
                yield LargeResponseChunk(data=data)

        async def send(archive: IO[bytes]) -> str:
            async with link.channel.request(
                f"{SERVICE}/UploadLargeResponse", Cardinality.STREAM_UNARY, LargeResponseChunk, LargeResponseStored
            ) as stream:
                stored = await upload_all(stream, chunks(archive))
            if stored is None or not stored.location:
                raise OSError("the node did not say where it keeps the large response")
            return stored.location

        try:
            packaged = await package(
                first,
                rest,
                output_dir=output_dir,
                besides=_NOT_OUTPUTS,
                scratch=self.config.response_dir,
                upload=upload,
            )
        except (OSError, GRPCError, StreamTerminatedError, TimeoutError, zipfile.BadZipFile) as err:
            log.error("request %s: its large response could not be packaged or stored: %s", rid, err)
            detail = "Internal error while uploading the large response"
            if isinstance(err, GRPCError) and err.status is GRPCStatus.RESOURCE_EXHAUSTED and err.message:
                detail = f"{detail}: {err.message}"
            return problem_frame(rid, attempt, 500, detail, source=WORKER_SERVICE)
        self._packaged.add(output_dir)  # its files went to the caller: no warning when they are removed
        log.info("request %s: large response packaged and stored", rid)
        return packaged

    async def _body(self, channel: Channel, session: ConnectResponse, request: Request) -> AsyncIterator[bytes]:
        async with channel.request(f"{SERVICE}/FetchBody", Cardinality.UNARY_STREAM, BodyRequest, BodyChunk) as stream:
            await stream.send_message(
                BodyRequest(
                    session_token=session.session_token,
                    request_id=request.request_id,
                    body_object=request.body_object or "",
                    capability=subjects.response_capability(request.reply),
                ),
                end=True,
            )
            while True:
                with anyio.fail_after(60):
                    chunk = await stream.recv_message()
                if chunk is None:
                    return
                yield chunk.data


def _first(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The first leaf exception of a (nested) group."""
    found: BaseException = group
    while isinstance(found, BaseExceptionGroup):
        found = found.exceptions[0]
    return found


async def _relay(frames: AsyncIterator[Frame], answer: Callable[[Frame], Awaitable[None]]) -> None:
    async for frame in frames:
        await answer(frame)


@final
class _Reply:
    """Where one request's answer goes: its frames, or word that it failed here."""

    def __init__(self, rid: str, out: Out, held: Settlement | None, *, stop: Callable[[], None]) -> None:
        self._rid, self._out, self._held, self._stop = rid, out, held, stop
        #: Whether any frame went out (a failure then cannot be a clean answer of its own).
        self.answered = False
        #: The answer's status (None: not answered, or failed here).
        self.status: int | None = None

    async def answer(self, frame: Frame) -> None:
        if not self.answered:
            self.status = frame.status
        self.answered = True
        if self._held is not None:
            # nats transport: straight to the client's node; nobody wants the rest: stop serving it.
            if not await self._held.relay(frame):
                self._stop()
            return
        envelope = WorkerEnvelope(frame=frame.encode())
        try:
            self._out.send_nowait(envelope)  # the usual case: room in the buffer, no extra loop turn
        except anyio.WouldBlock:
            await self._out.send(envelope)

    async def failed(self, reason: str) -> None:
        """Another instance gets it (or the client a 500 after max_deliver attempts)."""
        self.status = None
        if self._held is not None:
            await self._held.failed(reason)
        else:
            failure = RequestFailed(request_id=self._rid, reason=reason)
            await self._out.send(WorkerEnvelope(message=WorkerMessage(failed=failure)))


class _NotPrepared(Exception):
    """A request cannot be served here: its output directory or assets could not be made."""
