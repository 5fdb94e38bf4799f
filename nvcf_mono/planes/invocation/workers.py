"""The WorkerService: instances' workers connect here, and this node serves them their requests.

``ConnectOnce`` trades the per-instance worker token (from the creation message) for a session.
``Serve`` is the work channel: the node pulls the version's durable consumer on the worker's
behalf (never more unsettled deliveries than the instance's ``maxRequestConcurrency``), sends each
request down the stream, keeps it alive in JetStream while the worker works, relays the response
frames to the node that holds the client, and acks at the end. A worker that goes away leaves its
requests to be redelivered (at-least-once); one that has failed a request ``max_deliver`` times
gets a stored 500 result instead of taking down instance after instance.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, final

import anyio
import attrs
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectSendStream
from grpclib.const import Cardinality, Handler, Status
from grpclib.exceptions import GRPCError
from grpclib.server import Stream

from nvcf_mono import tracing
from nvcf_mono.auth.secret import Keyring
from nvcf_mono.auth.tokens import WORKER, InvalidToken, TokenSigner
from nvcf_mono.bus.api import Bus, Delivery
from nvcf_mono.bus.callout import CalloutStatus, envelope
from nvcf_mono.bus.codec import TypedKV
from nvcf_mono.bus.errors import BusError, NotFound
from nvcf_mono.bus.holding import hold_until_ready
from nvcf_mono.contracts import buckets, live_input, permissions, redelivery, rpc, subjects, trace
from nvcf_mono.contracts.frames import Frame, FrameError, Request, problem_frame
from nvcf_mono.contracts.messages import SecretsFetch, SecretsReply
from nvcf_mono.grpc.batch import MOST, accept_large_frames, send_all
from nvcf_mono.late import Late
from nvcf_mono.log import Throttle
from nvcf_mono.models.deployment import MAX_REQUEST_CONCURRENCY
from nvcf_mono.planes.invocation.affinity import Affinity, session_key
from nvcf_mono.planes.invocation.config import InvocationConfig
from nvcf_mono.planes.invocation.dispatch import Dispatcher
from nvcf_mono.planes.invocation.handover import Handover
from nvcf_mono.planes.invocation.large_responses import LargeResponses, TooLarge
from nvcf_mono.planes.invocation.responses import Capabilities
from nvcf_mono.planes.invocation.routing import RoutingTable
from nvcf_mono.planes.invocation.settlement import NodeSink
from nvcf_mono.planes.invocation.task_calls import TaskCalls
from nvcf_mono.proto.gen.nvcf.worker.v1 import (
    AssetChunk,
    AssetRequest,
    BodyChunk,
    BodyRequest,
    Cancel,
    ConnectRequest,
    ConnectResponse,
    Drain,
    InputChunk,
    InputWanted,
    LargeResponseChunk,
    LargeResponseStored,
    NodeMessage,
    SecretsRequest,
    SecretsResponse,
    SessionInfo,
    TaskConnectRequest,
    TaskConnectResponse,
    TaskHeartbeatRequest,
    TaskHeartbeatResponse,
    TaskResultAck,
    TaskResultChunk,
)
from nvcf_mono.proto.serve_wire import NODE_STOPPING, NodeEnvelope, WorkerEnvelope
from nvcf_mono.queues import batches
from nvcf_mono.settlement import BROKEN_OFF, Policy, Settlement

SESSION = permissions.WORKER_SESSION
SERVICE = "/nvcf.worker.v1.WorkerService"
#: Longest an upload from a worker may go without a message before it is given up (nothing is kept).
UPLOAD_SILENCE = 60.0


@attrs.frozen
class WorkerDeps:
    """What the service needs from the running plugin.

    ``capabilities`` checks that a worker was given the request it names (body fetches, orphaned
    frames). ``nats_url`` and ``callout`` make the nats transport possible: workers reach NATS
    there, and this node answers their auth callouts.
    """

    bus: Bus
    keyring: Keyring
    routing: RoutingTable
    dispatcher: Dispatcher
    sink: NodeSink
    capabilities: Capabilities
    nats_url: str | None = None
    callout: CalloutStatus | None = None
    #: Session affinity with the other invocation nodes (None: this node's sessions only).
    handover: Handover | None = None
    #: Where zipped large responses are kept (None: uploads are refused).
    large_responses: LargeResponses | None = None


@final
class WorkerService:
    """grpclib servicer; one instance per invocation node."""

    def __init__(self, config: InvocationConfig, log: logging.Logger) -> None:
        self._config = config
        self._log = log
        self.sessions: dict[str, WorkerSession] = {}
        #: Which instance took each conversation's last turn (``x-multi-turn-session-id``).
        self.affinity = Affinity()
        #: What calls need, set when the plugin runs (calls before that get UNAVAILABLE).
        self.deps: Late[WorkerDeps] = Late("the invocation plane")
        self._policy = Policy(max_deliver=config.max_deliver)
        self._tasks = TaskCalls(self._verify, lambda: self.deps.get().bus, lambda: self.deps.get().dispatcher.room, log)
        #: The node is stopping: sessions take no more requests, new ones are refused.
        self.leaving = False

    def leave(self) -> None:
        """The node is stopping: every session stops taking requests and ends once it holds none.

        Its worker then goes to another node at once, instead of waiting out this node's drain and being
        cut at its end.
        """
        self.leaving = True
        for session in list(self.sessions.values()):
            session.leave()

    def _refuse_if_leaving(self) -> None:
        if self.leaving:
            raise GRPCError(Status.UNAVAILABLE, NODE_STOPPING)

    def serving_session(self, version_id: str, instance_id: str) -> WorkerSession | None:
        """The grpc session of an instance that can take one more request of ``version_id`` now."""
        for session in self.sessions.values():
            if session.instance_id == instance_id and session.function_version_id == version_id and session.has_room:
                return session
        return None

    async def took(self, version_id: str, key: str, instance_id: str) -> None:
        """An instance connected here took a conversation's turn; the other nodes hear of it when they should."""
        handover = self.deps.get().handover
        if self.affinity.took(version_id, key, instance_id) and handover is not None:
            await handover.announce(version_id, key, instance_id)

    async def take_handed(self, version_id: str, instance_id: str, delivery: Delivery) -> bool:
        """Another node hands a conversation's turn to an instance connected here; False if it cannot take it."""
        session = self.serving_session(version_id, instance_id)
        if session is None:
            return False
        try:
            request = Request.decode(delivery.data)
        except FrameError as err:
            self._log.error("refusing a malformed request handed over from another node: %s", err)
            return False
        held = Settlement(delivery, request, policy=self._policy, sink=self.deps.get().sink)
        if not await session.offer(held, delivery):
            return False
        key = session_key(request)
        if key is not None:
            await self.took(version_id, key, instance_id)
        return True

    def _transport(self, offered: list[str]) -> str:
        """The configured transport when the worker offers it and it can work here, else grpc."""
        wanted, deps = self._config.transport, self.deps.get()
        if wanted == "nats" and "nats" in offered and deps.nats_url and deps.callout and deps.callout.available:
            return "nats"
        return "grpc"

    def __mapping__(self) -> dict[str, Handler]:
        return {
            f"{SERVICE}/ConnectOnce": Handler(
                self._connect_once, Cardinality.UNARY_UNARY, ConnectRequest, ConnectResponse
            ),
            # The hot stream: a codec that passes request and frame bytes through (serve_wire.py).
            f"{SERVICE}/Serve": Handler(self._serve, Cardinality.STREAM_STREAM, WorkerEnvelope, NodeEnvelope),
            f"{SERVICE}/FetchSecrets": Handler(
                self._fetch_secrets, Cardinality.UNARY_UNARY, SecretsRequest, SecretsResponse
            ),
            f"{SERVICE}/FetchBody": Handler(self._fetch_body, Cardinality.UNARY_STREAM, BodyRequest, BodyChunk),
            f"{SERVICE}/FetchAsset": Handler(self._fetch_asset, Cardinality.UNARY_STREAM, AssetRequest, AssetChunk),
            f"{SERVICE}/TaskConnect": Handler(
                self._tasks.connect, Cardinality.UNARY_UNARY, TaskConnectRequest, TaskConnectResponse
            ),
            f"{SERVICE}/TaskHeartbeat": Handler(
                self._tasks.heartbeat, Cardinality.UNARY_UNARY, TaskHeartbeatRequest, TaskHeartbeatResponse
            ),
            f"{SERVICE}/TaskUploadResult": Handler(
                self._tasks.upload, Cardinality.STREAM_UNARY, TaskResultChunk, TaskResultAck
            ),
            f"{SERVICE}/UploadLargeResponse": Handler(
                self._upload_large_response, Cardinality.STREAM_UNARY, LargeResponseChunk, LargeResponseStored
            ),
        }

    @property
    def _signer(self) -> TokenSigner:
        return TokenSigner(self.deps.get().keyring.token_key)

    def _verify(self, token: str, kind: str) -> dict[str, Any]:
        try:
            return self._signer.verify(token, kind)
        except InvalidToken as err:
            raise GRPCError(Status.UNAUTHENTICATED, f"invalid {kind} token: {err}") from err

    async def _connect_once(self, stream: Stream[ConnectRequest, ConnectResponse]) -> None:
        self._refuse_if_leaving()
        req = await stream.recv_message()
        assert req is not None
        claims = self._verify(req.worker_token, WORKER)
        fid, fvid = str(claims["fid"]), str(claims["fvid"])
        if not self.deps.get().routing.connectable(fid, fvid):
            raise GRPCError(Status.PERMISSION_DENIED, f"function version {fvid} is not deployed")
        await self.deps.get().dispatcher.ensure(fvid)
        ttl = self._config.session_ttl
        transport = self._transport(list(req.transports))
        stream_name, durable = self.deps.get().dispatcher.stream_name(fvid), self.deps.get().dispatcher.durable(fvid)
        session_claims = {"fid": fid, "fvid": fvid, "nca": claims["nca"], "rid": claims["rid"], "iid": req.instance_id}
        inbox = ""
        if transport == "nats":
            # The nats transport's auth callout grants exactly this stream and durable, and
            # subscriptions under this session's own inbox prefix only.
            inbox = subjects.worker_inbox(uuid.uuid4().hex)
            session_claims.update({"tr": "nats", "st": stream_name, "du": durable, "ib": inbox})
        token = self._signer.mint(SESSION, session_claims, ttl=ttl)
        await stream.send_message(
            ConnectResponse(
                session_token=token,
                region=self.deps.get().dispatcher.region,
                expires_ms=int((time.time() + ttl) * 1000),
                max_concurrency=max(1, req.max_concurrency),
                transport=transport,
                nats_url=(self.deps.get().nats_url or "") if transport == "nats" else "",
                nats_token=envelope("APP", "worker", token) if transport == "nats" else "",
                nats_inbox_prefix=inbox,
                stream=stream_name,
                durable=durable,
                cancel_subject=subjects.cancel_subject(fvid),
                ack_wait_seconds=int(self._config.ack_wait),
                max_deliver=self._config.max_deliver,
                status_interval_ms=int(self._config.load_report_interval * 1000),
            )
        )

    async def _fetch_secrets(self, stream: Stream[SecretsRequest, SecretsResponse]) -> None:
        req = await stream.recv_message()
        assert req is not None
        self._verify(req.worker_token, WORKER)
        try:
            reply = await rpc.call(
                self.deps.get().bus, subjects.SECRETS_FETCH, SecretsFetch(worker_token=req.worker_token), SecretsReply
            )
        except rpc.RpcError as err:
            status = Status.PERMISSION_DENIED if err.code in (401, 403) else Status.UNAVAILABLE
            raise GRPCError(status, err.message) from err
        except BusError as err:
            raise GRPCError(Status.UNAVAILABLE, f"the control plane did not answer: {err}") from err
        await stream.send_message(
            SecretsResponse(secrets_json=json.dumps(reply.secrets), telemetry_exports_json=reply.telemetry_exports)
        )

    async def _fetch_body(self, stream: Stream[BodyRequest, BodyChunk]) -> None:
        req = await stream.recv_message()
        assert req is not None
        claims = self._verify(req.session_token, SESSION)
        # Only a worker given the request (it has the capability of its reply subject) reads its body.
        if req.body_object != buckets.request_body_object(req.request_id) or not self.deps.get().capabilities.holds(
            str(claims["fvid"]), req.request_id, req.capability
        ):
            raise GRPCError(Status.PERMISSION_DENIED, f"request {req.request_id} was not given to this worker")
        try:
            async with self.deps.get().dispatcher.payloads.open(req.body_object) as reader:
                async for chunk in reader:
                    await stream.send_message(BodyChunk(data=chunk))
        except BusError as err:
            raise GRPCError(Status.NOT_FOUND, f"request body {req.body_object}: {err}") from err

    async def _upload_large_response(self, stream: Stream[LargeResponseChunk, LargeResponseStored]) -> None:
        """A request's zipped large response, from the worker given the request; answered with its link."""
        first = await stream.recv_message()
        if first is None:
            raise GRPCError(Status.INVALID_ARGUMENT, "no data")
        claims = self._verify(first.session_token, SESSION)
        deps = self.deps.get()
        if not deps.capabilities.holds(str(claims["fvid"]), first.request_id, first.capability):
            raise GRPCError(Status.PERMISSION_DENIED, f"request {first.request_id} was not given to this worker")
        if deps.large_responses is None:
            raise GRPCError(Status.UNIMPLEMENTED, "this node keeps no large responses")

        async def chunks() -> AsyncIterator[bytes]:
            if first.data:
                yield first.data
            while True:
                with anyio.fail_after(UPLOAD_SILENCE):
                    chunk = await stream.recv_message()
                if chunk is None:
                    return
                yield chunk.data

        try:
            location, size = await deps.large_responses.store(first.request_id, chunks())
        except TooLarge as err:
            raise GRPCError(Status.RESOURCE_EXHAUSTED, str(err)) from err
        except TimeoutError as err:
            raise GRPCError(Status.DEADLINE_EXCEEDED, f"the upload went silent for {UPLOAD_SILENCE:g}s") from err
        except BusError as err:
            raise GRPCError(Status.UNAVAILABLE, f"the large response could not be stored: {err}") from err
        await stream.send_message(LargeResponseStored(location=location, size=size))

    async def _fetch_asset(self, stream: Stream[AssetRequest, AssetChunk]) -> None:
        """An input asset of a request the calling worker holds, streamed from the asset store."""
        req = await stream.recv_message()
        assert req is not None
        claims = self._verify(req.session_token, SESSION)
        # Only the worker serving the request may read its assets, and only the ones it names.
        request = next(
            (
                held.request
                for session in self.sessions.values()
                if session.function_version_id == claims["fvid"] and session.instance_id == claims.get("iid")
                for held in (session.in_flight.get(req.request_id),)
                if held is not None
            ),
            None,
        )
        if request is None:
            raise GRPCError(Status.NOT_FOUND, f"request {req.request_id} is not held by this worker")
        if req.asset_id not in request.asset_ids:
            raise GRPCError(
                Status.PERMISSION_DENIED, f"asset {req.asset_id} is not an input asset of request {req.request_id}"
            )
        missing = GRPCError(Status.NOT_FOUND, f"asset {req.asset_id} not found in account {request.nca_id}")
        try:
            found = await TypedKV(self.deps.get().bus.kv(buckets.ASSETS.name), buckets.ASSET).get(
                buckets.account_item_key(request.nca_id, req.asset_id)
            )
            if found is None or found.value.uploaded_at is None:
                raise missing
            content_type = found.value.content_type
            async with (
                self.deps.get()
                .bus.objects(buckets.ASSET_CONTENT.name)
                .open(buckets.asset_object(request.nca_id, req.asset_id)) as reader
            ):
                size = reader.info.size
                sent = False
                async for chunk in reader:
                    # The first chunk says what the whole is; the rest are data only.
                    await stream.send_message(
                        AssetChunk(data=chunk) if sent else AssetChunk(data=chunk, content_type=content_type, size=size)
                    )
                    sent = True
                if not sent:
                    await stream.send_message(AssetChunk(content_type=content_type, size=0))
        except NotFound as err:
            raise missing from err
        except BusError as err:
            raise GRPCError(Status.UNAVAILABLE, f"asset {req.asset_id} could not be read: {err}") from err

    async def _serve(self, stream: Stream[WorkerEnvelope, NodeEnvelope]) -> None:
        self._refuse_if_leaving()
        with anyio.fail_after(10):
            first = await stream.recv_message()
        if first is None or first.message is None or first.kind != "hello":
            raise GRPCError(Status.INVALID_ARGUMENT, "the first message must be a hello with the session token")
        hello = first.message.hello
        claims = self._verify(hello.session_token, SESSION)
        session = WorkerSession(
            self,
            function_id=str(claims["fid"]),
            function_version_id=str(claims["fvid"]),
            instance_id=hello.instance_id or str(claims.get("iid", "")),
            max_concurrency=max(1, hello.max_concurrency),
            transport=str(claims.get("tr", "grpc")),
            durable=(str(claims["st"]), str(claims["du"])) if claims.get("tr") == "nats" else None,
        )
        self.sessions[session.id] = session
        try:
            await session.run(stream)
        finally:
            self.sessions.pop(session.id, None)


class WorkerSession:
    """One worker's Serve stream."""

    def __init__(
        self,
        service: WorkerService,
        *,
        function_id: str,
        function_version_id: str,
        instance_id: str,
        max_concurrency: int,
        transport: str = "grpc",
        durable: tuple[str, str] | None = None,
    ) -> None:
        self._svc = service
        self.transport = transport
        #: nats transport: (stream, durable) the session's token grants; what it may say it holds.
        self.durable = durable
        #: At most this many deliveries held, or responses orphaned, at once (a worker pulls within its slots).
        self._held_limit = 2 * min(max(max_concurrency, 1), MAX_REQUEST_CONCURRENCY)
        #: nats transport: frames of requests whose node went away, kept here to be stored.
        self._orphans: dict[str, list[Frame]] = {}
        self._orphaned_bytes = 0
        #: Orphaned responses stored as too large whose last frame has not come (oldest first, bounded).
        self._given_up: dict[str, None] = {}
        #: nats transport: request id -> ack subject of what the worker pulled and holds itself.
        self.held_remotely: dict[str, str] = {}
        self.function_id = function_id
        self.function_version_id = function_version_id
        self.instance_id = instance_id
        self.max_concurrency = max_concurrency
        self.id = f"{instance_id}:{id(self):x}"
        #: grpc transport: what this node delivered to the worker and has not settled.
        self.in_flight: dict[str, Settlement] = {}
        self.ready = anyio.Event()
        self.ready.set()
        self.draining = False
        #: Set when this node stops: the session ends once it holds nothing (``leave``).
        self._leaving = anyio.Event()
        #: The worker's own account of its load (its last status).
        self.reported_in_flight = 0
        self.busy_seconds = 0.0
        self._log = service._log
        #: What the worker says that it must not (a worker runs beside tenant code): logged, not line by line.
        self._complaints = Throttle()
        #: Where messages to the worker go (set while the session runs): other sessions hand turns here.
        self._out: MemoryObjectSendStream[NodeEnvelope] | None = None
        #: Live gRPC calls whose client stream this node is asking for on the worker's behalf (one question each).
        self._asking: set[str] = set()

    @property
    def serving(self) -> bool:
        """Ready for requests (its inference server healthy) and not draining."""
        return self.ready.is_set() and not self.draining

    @property
    def has_room(self) -> bool:
        """Can be given one more request now (grpc transport: the node holds its deliveries)."""
        return (
            self.transport == "grpc"
            and self.serving
            and self._out is not None
            and len(self.in_flight) < self.max_concurrency
        )

    def leave(self) -> None:
        """The node is stopping: take no more requests; end once what the worker holds is settled."""
        self.draining = True
        self.ready.set()  # wakes whatever waits for readiness; it sees the drain
        self._leaving.set()
        if self.transport == "nats" and self._out is not None:
            # Its worker pulls for itself: told now, it stops pulling, or under steady load it never
            # holds nothing and the session outlives the drain. (Said again as the session ends.)
            with contextlib.suppress(anyio.WouldBlock, anyio.ClosedResourceError, anyio.BrokenResourceError):
                self._out.send_nowait(_LEAVE)

    @property
    def _left(self) -> bool:
        """Told to leave, and holding nothing now: the session ends."""
        return self._leaving.is_set() and not self.in_flight and not self.held_remotely

    async def offer(self, held: Settlement, delivery: Delivery) -> bool:
        """Give this session's worker a request another session pulled; False if it cannot take it now."""
        out = self._out
        if out is None or not self.has_room:
            return False
        try:
            await self._deliver(held, delivery, out)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            self.in_flight.pop(held.request.request_id, None)
            return False  # the session just ended
        return True

    async def run(self, stream: Stream[WorkerEnvelope, NodeEnvelope]) -> None:
        send, recv = anyio.create_memory_object_stream[NodeEnvelope](self.max_concurrency + 16)
        self._out = send
        try:
            said_leave = anyio.Event()
            async with send, recv, anyio.create_task_group() as tg:  # recv too: the sender may never start

                async def sender() -> None:
                    async with recv:
                        async for batch in batches(recv, MOST):
                            await send_all(stream, batch)
                            if self._leaving.is_set() and any(envelope is _LEAVE for envelope in batch):
                                said_leave.set()

                tg.start_soon(sender)
                await send.send(
                    _message(NodeMessage(session=SessionInfo(session_id=self.id, max_concurrency=self.max_concurrency)))
                )
                accept_large_frames(stream)
                if self.transport == "grpc":
                    # On the nats transport the worker pulls, keeps alive and hears cancels itself.
                    tg.start_soon(self._pull, send)
                    tg.start_soon(self._keepalive)
                    tg.start_soon(self._cancellations, send)
                async with anyio.create_task_group() as ends:  # the worker's end, or this node's

                    async def left_idle() -> None:
                        await self._leaving.wait()
                        if self._left:  # else _receive ends once the last thing held is settled
                            ends.cancel_scope.cancel()

                    ends.start_soon(left_idle)
                    await self._receive(stream, send, tg)
                    ends.cancel_scope.cancel()
                if self._leaving.is_set():
                    # Said before the stream ends, which the worker may see only as a reset.
                    with anyio.move_on_after(LEAVE_TIMEOUT):
                        await send.send(_LEAVE)
                        await said_leave.wait()
                tg.cancel_scope.cancel()
        finally:
            self._out = None
            with anyio.move_on_after(10, shield=True):
                await self._release()

    # ---- requests down ------------------------------------------------------------------------------

    async def _pull(self, out: MemoryObjectSendStream[NodeEnvelope]) -> None:
        deps = self._svc.deps.get()
        stream = deps.bus.stream(deps.dispatcher.stream_name(self.function_version_id))
        durable = deps.dispatcher.durable(self.function_version_id)
        while True:
            await self.ready.wait()
            if self.draining:
                return
            async with stream.consume(
                durable, batch=self.max_concurrency, max_inflight=self.max_concurrency, fetch_timeout=5.0
            ) as deliveries:
                async for delivery in deliveries:
                    await self._dispatch(delivery, out)
                    if self._draining_now():
                        deliveries.stop()  # what is on its way to this session is given back, not lost
                        break
                    if not self.ready.is_set():
                        break

    def _draining_now(self) -> bool:
        """Its node stops or its worker drains (read afresh: it changes while the session pulls)."""
        return self.draining

    async def _dispatch(self, delivery: Delivery, out: MemoryObjectSendStream[NodeEnvelope]) -> None:
        try:
            request = Request.decode(delivery.data)
        except FrameError as err:
            self._log.error("dropping a malformed request in %s: %s", delivery.subject, err)
            await delivery.term()
            return
        if not self.ready.is_set() and not self.draining:
            await hold_until_ready(
                lambda: self.ready, delivery, within=redelivery.PAUSED_HOLD, keepalive=self._svc._config.keepalive
            )
        held = Settlement(delivery, request, policy=self._svc._policy, sink=self._svc.deps.get().sink)
        if self.draining or not self.ready.is_set():
            await held.give_back()  # still paused, or going away: another instance takes it
            return
        if await held.refused_on_arrival():
            return
        key = session_key(request)
        if key is not None and await self._hand_over(key, held, delivery):
            return
        await self._deliver(held, delivery, out)

    async def _hand_over(self, key: str, held: Settlement, delivery: Delivery) -> bool:
        """Give a conversation's turn to the instance that took its last one, when it can take it now.

        True when it is not this session's to serve: another session here or another node took it,
        or another node may have (no answer), in which case it is left to redelivery.
        """
        svc, version = self._svc, self.function_version_id
        place = svc.affinity.place_of(version, key)
        if place is not None and place.instance != self.instance_id:
            handover = svc.deps.get().handover
            if place.node == svc.affinity.node:
                other = svc.serving_session(version, place.instance)
                if other is not None and await other.offer(held, delivery):
                    if handover is not None:
                        handover.handovers.inc(outcome="local")
                    await svc.took(version, key, place.instance)
                    return True
            elif handover is not None and (outcome := await handover.offer(place, version, delivery)) != "refused":
                delivery.hand_off()  # its node settles it now (and announces the turn), or redelivery will
                if outcome == "unknown":
                    svc.affinity.forget(version, key)
                return True
        await svc.took(version, key, self.instance_id)
        return False

    async def _deliver(self, held: Settlement, delivery: Delivery, out: MemoryObjectSendStream[NodeEnvelope]) -> None:
        """Send a request to this session's worker; it is this session's until settled."""
        request = held.request
        self.in_flight[request.request_id] = held
        span = (
            tracing.start(
                "deliver",
                parent=tracing.extract(request.headers),
                kind="consumer",
                **{trace.REQUEST_ID: request.request_id, trace.ATTEMPT: delivery.num_delivered},
            )
            if tracing.enabled()
            else None
        )
        envelope = NodeEnvelope(request=delivery.data, attempt=delivery.num_delivered)
        try:
            out.send_nowait(envelope)  # the usual case: room in the buffer, no extra loop turn
        except anyio.WouldBlock:
            await out.send(envelope)
        finally:
            tracing.end(span)

    async def _keepalive(self) -> None:
        while True:
            await anyio.sleep(self._svc._config.keepalive)
            for held in list(self.in_flight.values()):
                await held.keep_alive()

    async def _cancellations(self, out: MemoryObjectSendStream[NodeEnvelope]) -> None:
        async with self._svc.deps.get().bus.subscribe(subjects.cancel_subject(self.function_version_id)) as sub:
            async for msg in sub:
                request_id = msg.data.decode(errors="replace")
                held = self.in_flight.pop(request_id, None)
                if held is not None:
                    await self._stop(out, request_id, "cancelled by the client")
                    await held.cancelled()

    async def _stop(self, out: MemoryObjectSendStream[NodeEnvelope], request_id: str, reason: str) -> None:
        """Tell the worker to stop serving a request."""
        await out.send(_message(NodeMessage(cancel=Cancel(request_id=request_id, reason=reason))))

    # ---- frames up ----------------------------------------------------------------------------------

    async def _receive(
        self,
        stream: Stream[WorkerEnvelope, NodeEnvelope],
        out: MemoryObjectSendStream[NodeEnvelope],
        tasks: TaskGroup,
    ) -> None:
        while not self._left:
            envelope = await stream.recv_message()
            if envelope is None:
                return
            if envelope.frame is not None:
                await self._on_frame(envelope.frame, out)
                continue
            if envelope.held is not None:  # nats transport: the worker pulled this request itself
                self._held(*envelope.held)
                continue
            if envelope.released is not None:
                self.held_remotely.pop(envelope.released, None)
                continue
            message = envelope.message
            assert message is not None
            kind = envelope.kind
            if kind == "status":
                self.reported_in_flight = message.status.in_flight
                self.busy_seconds = max(self.busy_seconds, message.status.busy_seconds)
                if message.status.ready:
                    self.ready.set()
                elif self.ready.is_set():
                    self.ready = anyio.Event()
            elif kind == "failed":
                held = self.in_flight.pop(message.failed.request_id, None)
                if held is not None:
                    await held.failed(message.failed.reason)
            elif kind == "drain":
                self.draining = True
                self.ready.set()  # wakes whatever waits for readiness; it sees the drain
            elif kind == "input_wanted":
                await self._want_input(message.input_wanted, out, tasks)

    async def _want_input(
        self, wanted: InputWanted, out: MemoryObjectSendStream[NodeEnvelope], tasks: TaskGroup
    ) -> None:
        """Ask the client's node for a live call's stream, for the worker (which has no NATS of its own)."""
        rid = wanted.request_id
        held = self.in_flight.get(rid)
        if held is None or not held.request.live_input:
            # Not (or no longer) this worker's live call: nothing will come.
            gone = InputChunk(request_id=rid, offset=wanted.offset, answer=live_input.answer(live_input.GONE))
            await out.send(_message(NodeMessage(input=gone)))
            return
        if rid in self._asking:
            return  # asked already: that answer comes (a worker asks again only after giving up waiting)
        self._asking.add(rid)
        tasks.start_soon(self._fetch_input, held.request, wanted.offset, out)

    async def _fetch_input(self, request: Request, offset: int, out: MemoryObjectSendStream[NodeEnvelope]) -> None:
        try:
            answer = await self._svc.deps.get().sink.input(request, offset)
        finally:
            self._asking.discard(request.request_id)
        chunk = InputChunk(request_id=request.request_id, offset=offset, answer=answer)
        await out.send(_message(NodeMessage(input=chunk)))

    def _complain(self, msg: str, *args: object) -> None:
        self._complaints.log(self._log, logging.WARNING, msg, *args)

    def _held(self, request_id: str, ack_subject: str) -> None:
        """Remember a delivery the worker pulled, to nak it if the session ends first.

        Only one of its own version's deliveries, and no more than it may hold: the nak is published
        with this node's rights, so a session must not name any other subject (or flood the table).
        """
        if self.durable is None or not permissions.is_worker_ack(ack_subject, *self.durable):
            self._complain(
                "worker session %s says it holds %r, which is no delivery of its version; ignored", self.id, ack_subject
            )
        elif request_id not in self.held_remotely and len(self.held_remotely) >= self._held_limit:
            self._complain("worker session %s says it holds more than its slots; %r ignored", self.id, request_id)
        else:
            self.held_remotely[request_id] = ack_subject

    async def _on_frame(self, blob: bytes, out: MemoryObjectSendStream[NodeEnvelope]) -> None:
        try:
            frame = Frame.decode(blob)
        except FrameError as err:
            self._complain("malformed frame from %s: %s", self.instance_id, err)
            return
        held = self.in_flight.get(frame.request_id)
        if held is None:
            if self.transport == "nats":
                if self._svc.deps.get().capabilities.holds(
                    self.function_version_id, frame.request_id, frame.capability
                ):
                    await self._orphan(frame)
                else:
                    self._complain(
                        "refusing a frame for %s from %s: a request it was not given",
                        frame.request_id,
                        self.instance_id,
                    )
            return  # cancelled or already settled: drop
        if not await held.relay(frame, blob):
            self.in_flight.pop(frame.request_id, None)
            await self._stop(out, frame.request_id, "the client went away")
        elif frame.last:
            self.in_flight.pop(frame.request_id, None)

    async def _orphan(self, frame: Frame) -> None:
        """Frames a nats-transport worker could not hand to their node: kept, and stored at their end.

        Held in memory until then, so within :data:`ORPHANED_BYTES` for the whole session: a response
        that would pass it is stored as a 502 instead, and its frames let go.
        """
        rid = frame.request_id
        if rid in self._given_up:  # already stored as too large: the rest of it is dropped
            if frame.last:
                del self._given_up[rid]
            return
        frames = self._orphans.get(rid)
        if frames is None:
            if len(self._orphans) >= self._held_limit:
                self._complain("worker session %s sends more orphaned responses than its slots", self.id)
                return
            frames = self._orphans[rid] = []
        self._orphaned_bytes += len(frame.body)
        frames.append(frame)
        if self._orphaned_bytes > ORPHANED_BYTES:
            frames = [problem_frame(rid, 502, f"{TOO_LARGE_TO_KEEP} ({ORPHANED_BYTES} bytes)")]
            if not frame.last:
                self._given_up[rid] = None
                if len(self._given_up) > self._held_limit:
                    del self._given_up[next(iter(self._given_up))]
        elif not frame.last:
            return
        elif frames[0].seq != 0:
            frames = [problem_frame(rid, 502, BROKEN_OFF)]
        self._orphaned_bytes -= sum(len(f.body) for f in self._orphans.pop(rid))
        await self._svc.deps.get().sink.store(frames)

    # ---- endings ------------------------------------------------------------------------------------

    async def _release(self) -> None:
        """The worker is gone: what it held goes to another instance at once (or ends, after max_deliver)."""
        held_all = list(self.in_flight.values())
        self.in_flight.clear()
        for held in held_all:
            await held.failed("the worker disconnected")
        remote, self.held_remotely = self.held_remotely, {}
        for ack_subject in remote.values():
            # Pulled by the worker itself (nats transport): handed back now, not after ack_wait.
            await self._svc.deps.get().bus.give_back(ack_subject)


#: What a node keeps in memory of one session's orphaned responses (their caller's node went away).
ORPHANED_BYTES = 64 * 1024 * 1024
TOO_LARGE_TO_KEEP = "the response was larger than an invocation node keeps for a caller whose node went away"


def _message(message: NodeMessage) -> NodeEnvelope:
    return NodeEnvelope(message=message)


#: What a session of a stopping node says last: the worker connects to another node.
_LEAVE = _message(NodeMessage(leave=Drain(reason=NODE_STOPPING)))
#: How long a stopping node's session tries to say so (a worker that reads nothing is ended anyway).
LEAVE_TIMEOUT = 5.0
