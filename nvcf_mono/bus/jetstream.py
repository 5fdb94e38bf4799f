"""JetStream streams, durable pull consumers and deliveries over nats-py."""

from __future__ import annotations

import contextlib
import json
import math
import re
import time
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any, final

import anyio
import anyio.lowlevel
import nats.errors
import nats.js.errors as js_errors
import orjson
from nats.aio.msg import Msg as NatsMsg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext, api

from nvcf_mono.bus.api import (
    ConsumerSpec,
    ConsumerState,
    ConsumerStatistics,
    Headers,
    PubAck,
    StoredMsg,
    StoreUsage,
    StreamSpec,
    StreamState,
)
from nvcf_mono.bus.errors import (
    BusError,
    BusUnavailable,
    NotFound,
    RequestTimeout,
    SpecConflict,
    StoreFull,
    StreamFull,
)
from nvcf_mono.bus.replies import Replies
from nvcf_mono.queues import Wakeup

# JetStream API error codes (nats-server's errors.json).
STREAM_NOT_FOUND = 10059
_CONSUMER_NOT_FOUND = 10014
_STREAM_NAME_IN_USE = 10058
_MAX_MESSAGES = 10077
_MAX_BYTES = 10054  # "maximum bytes exceeded" on a discard-new stream
_MAX_MSGS_PER_SUBJECT = 10164
_INSUFFICIENT_RESOURCES = 10023  # a message that does not fit in what is left of the store
_INSUFFICIENT_STORAGE = 10047  # a stream whose reservation does not fit
_MSG_DELETE_FAILED = 10057  # its description says why; some reasons only mean the message is not there
_NO_SUCH_MSG = re.compile(r"no message found|stream store EOF", re.IGNORECASE)


def translate(err: Exception, what: str) -> BusError:
    """Turn a nats-py error into the bus's own."""
    if isinstance(err, js_errors.NotFoundError):
        return NotFound(f"{what}: not found")
    if isinstance(err, js_errors.NoStreamResponseError):
        return NotFound(f"{what}: no stream stores this subject")
    if isinstance(err, js_errors.APIError):
        description = err.description or ""
        if err.err_code in (_MAX_MESSAGES, _MAX_BYTES, _MAX_MSGS_PER_SUBJECT) or "maximum" in description:
            return StreamFull(f"{what}: {description}")
        if err.err_code in (_INSUFFICIENT_RESOURCES, _INSUFFICIENT_STORAGE):
            return StoreFull(f"{what}: {description or 'insufficient storage resources'}")
        if err.err_code in (STREAM_NOT_FOUND, _CONSUMER_NOT_FOUND) or err.code == 404:
            return NotFound(f"{what}: {description or 'not found'}")
        if err.code == 503:  # JetStream temporarily unavailable (e.g. still recovering its store)
            return BusUnavailable(f"{what}: {description or 'JetStream is unavailable'}")
        return BusError(f"{what}: {description or err} (code {err.err_code})")
    if isinstance(err, nats.errors.TimeoutError | TimeoutError):
        return RequestTimeout(f"{what}: no answer from JetStream in time")
    if isinstance(err, nats.errors.ConnectionClosedError):
        return BusUnavailable(f"{what}: the bus connection is closed")
    if isinstance(err, nats.errors.NoRespondersError):
        return BusUnavailable(f"{what}: JetStream is not available")
    return BusError(f"{what}: {err}")


_NATS_ERRORS = (nats.errors.Error, TimeoutError)


def _optional_seconds(value: float) -> float | None:
    return value if value > 0 else None


def stream_config(spec: StreamSpec, default_storage: str, default_replicas: int) -> api.StreamConfig:
    """The nats-py config for a declared stream."""
    storage = spec.storage or default_storage
    duplicate_window = spec.duplicate_window
    if spec.max_age > 0:
        # The server refuses a duplicate window longer than max_age (nothing older is kept to match).
        duplicate_window = min(duplicate_window, spec.max_age)
    return api.StreamConfig(
        name=spec.name,
        description=spec.description or None,
        subjects=list(spec.subjects),
        retention=api.RetentionPolicy(spec.retention.value),
        max_msgs=spec.max_msgs,
        max_bytes=spec.max_bytes,
        discard=api.DiscardPolicy(spec.discard.value),
        discard_new_per_subject=spec.discard_new_per_subject,
        max_age=_optional_seconds(spec.max_age),
        max_msgs_per_subject=spec.max_msgs_per_subject,
        max_msg_size=spec.max_msg_size,
        storage=api.StorageType.FILE if storage == "file" else api.StorageType.MEMORY,
        num_replicas=spec.replicas or default_replicas,
        duplicate_window=duplicate_window,
        allow_direct=spec.allow_direct,
        allow_msg_ttl=spec.allow_msg_ttl or None,
    )


# Fields compared to decide whether an existing stream needs an update.
_COMPARED = (
    "subjects", "retention", "max_msgs", "max_bytes", "discard", "discard_new_per_subject", "max_age",
    "max_msgs_per_subject", "max_msg_size", "storage", "num_replicas", "duplicate_window", "allow_direct",
    "allow_msg_ttl", "allow_rollup_hdrs", "deny_delete", "description", "subject_delete_marker_ttl",
)  # fmt: skip


def _normalised(config: api.StreamConfig, field: str) -> Any:
    value = getattr(config, field)
    if field in ("max_age", "duplicate_window", "subject_delete_marker_ttl"):
        return round(value or 0.0, 3)
    if field in (
        "allow_msg_ttl",
        "allow_direct",
        "allow_rollup_hdrs",
        "deny_delete",
        "discard_new_per_subject",
    ):
        return bool(value)
    if field == "subjects":
        return sorted(value or [])
    if field == "description":
        return value or None
    if field in ("max_msgs", "max_bytes", "max_msg_size", "max_msgs_per_subject"):
        return -1 if value in (None, 0) and field != "max_msgs_per_subject" else value
    return value


def differences(current: api.StreamConfig, wanted: api.StreamConfig) -> list[str]:
    """Names of the fields where an existing stream differs from the declared one."""
    return [f for f in _COMPARED if _normalised(current, f) != _normalised(wanted, f)]


async def ensure_stream_config(js: JetStreamContext, config: api.StreamConfig) -> api.StreamInfo:
    """Create a stream, or update it when its configuration differs; idempotent and race-safe."""
    name = config.name or "?"
    for _ in range(3):
        try:
            info = await js.stream_info(name)
        except js_errors.NotFoundError:
            try:
                return await js.add_stream(config)
            except js_errors.BadRequestError as err:
                if err.err_code == _STREAM_NAME_IN_USE:
                    continue  # someone else created it first; compare with theirs
                raise SpecConflict(f"stream {name}: {err.description}") from err
            except _NATS_ERRORS as err:
                raise translate(err, f"stream {name}") from err
        except _NATS_ERRORS as err:
            raise translate(err, f"stream {name}") from err
        changed = differences(info.config, config)
        if not changed:
            return info
        try:
            return await js.update_stream(config)
        except js_errors.APIError as err:
            raise SpecConflict(
                f"stream {name} exists with a different {', '.join(changed)} that cannot be changed in place: "
                f"{err.description}"
            ) from err
        except _NATS_ERRORS as err:
            raise translate(err, f"stream {name}") from err
    raise SpecConflict(f"stream {name}: could not create or update it")


async def stream_names(js: JetStreamContext, subject: str | None, timeout: float) -> list[str]:
    """Every stream name (storing ``subject``, when given), page by page."""
    names: list[str] = []
    while True:
        payload: dict[str, Any] = {"offset": len(names)}
        if subject:
            payload["subject"] = subject
        try:
            resp = await js._api_request(f"{js._prefix}.STREAM.NAMES", _json(payload), timeout=timeout)
        except _NATS_ERRORS as err:
            raise translate(err, "list streams") from err
        page = resp.get("streams") or []
        names.extend(page)
        if not page or len(names) >= int(resp.get("total") or 0):
            return names


async def stream_states(js: JetStreamContext, subject: str, timeout: float) -> dict[str, StreamState]:
    """The state of every stream storing ``subject``, a page (up to 256 streams) per call."""
    out: dict[str, StreamState] = {}
    while True:
        payload = {"offset": len(out), "subject": subject}
        try:
            resp = await js._api_request(f"{js._prefix}.STREAM.LIST", _json(payload), timeout=timeout)
        except _NATS_ERRORS as err:
            raise translate(err, "list streams") from err
        page = resp.get("streams") or []
        for raw in page:
            # Read straight from the JSON: nats-py's StreamInfo costs more than the call for big listings.
            name, state = str(raw["config"]["name"]), raw.get("state") or {}
            out[name] = StreamState(
                name=name,
                messages=int(state.get("messages") or 0),
                bytes=int(state.get("bytes") or 0),
                first_seq=int(state.get("first_seq") or 0),
                last_seq=int(state.get("last_seq") or 0),
                consumer_count=int(state.get("consumer_count") or 0),
            )
        if not page or len(out) >= int(resp.get("total") or 0):
            return out


async def store_usage(js: JetStreamContext, timeout: float) -> StoreUsage:
    """The account's JetStream usage, with the reservations nats-py's AccountInfo leaves out."""
    try:
        resp = await js._api_request(f"{js._prefix}.INFO", b"", timeout=timeout)
    except _NATS_ERRORS as err:
        raise translate(err, "JetStream account info") from err
    limit = int((resp.get("limits") or {}).get("max_storage") or -1)
    return StoreUsage(
        max_storage=limit if limit > 0 else None,
        storage=int(resp.get("storage") or 0),
        memory=int(resp.get("memory") or 0),
        reserved_storage=int(resp.get("reserved_storage") or 0),
        reserved_memory=int(resp.get("reserved_memory") or 0),
        streams=int(resp.get("streams") or 0),
        consumers=int(resp.get("consumers") or 0),
    )


def stream_state(name: str, info: api.StreamInfo) -> StreamState:
    """The bus's snapshot of a stream from nats-py's info."""
    s = info.state
    return StreamState(
        name=name,
        messages=s.messages,
        bytes=s.bytes,
        first_seq=s.first_seq,
        last_seq=s.last_seq,
        consumer_count=s.consumer_count,
    )


def consumer_config(spec: ConsumerSpec) -> api.ConsumerConfig:
    """The nats-py config of a durable pull consumer."""
    filters = list(spec.filter_subjects)
    return api.ConsumerConfig(
        name=spec.durable,
        durable_name=spec.durable,
        description=spec.description or None,
        deliver_policy=api.DeliverPolicy(spec.deliver_policy.value),
        ack_policy=api.AckPolicy.EXPLICIT,
        ack_wait=spec.ack_wait,
        max_deliver=spec.max_deliver,
        max_ack_pending=spec.max_ack_pending,
        max_waiting=spec.max_waiting,
        backoff=list(spec.backoff) or None,
        filter_subject=filters[0] if len(filters) == 1 else None,
        filter_subjects=filters if len(filters) > 1 else None,
        inactive_threshold=spec.inactive_threshold,
    )


def _consumer_state(info: api.ConsumerInfo) -> ConsumerState:
    return ConsumerState(
        name=info.name,
        num_pending=info.num_pending or 0,
        num_ack_pending=info.num_ack_pending or 0,
        num_redelivered=info.num_redelivered or 0,
        num_waiting=info.num_waiting or 0,
        delivered_stream_seq=info.delivered.stream_seq if info.delivered else 0,
        ack_floor_stream_seq=info.ack_floor.stream_seq if info.ack_floor else 0,
    )


@final
class NatsStream:
    """A handle on one stream."""

    def __init__(self, js: JetStreamContext, replies: Replies, name: str, timeout: float) -> None:
        self._js = js
        self._replies = replies
        self.name = name
        self._timeout = timeout

    async def publish(
        self,
        subject: str,
        data: bytes = b"",
        *,
        msg_id: str | None = None,
        headers: Headers | None = None,
        ttl: float | None = None,
        timeout: float | None = None,
    ) -> PubAck:
        """Store a message in this stream; ``msg_id`` deduplicates within the duplicate window."""
        hdrs = dict(headers) if headers else {}
        if msg_id is not None:
            hdrs[api.Header.MSG_ID] = msg_id
        if ttl is not None:
            # JetStream TTLs are whole seconds; round up so a value never lives shorter than asked.
            hdrs[api.Header.MSG_TTL] = f"{max(1, math.ceil(ttl))}s"
        try:
            seq, duplicate = await self._replies.publish(
                subject, data, stream=self.name, timeout=timeout or self._timeout, headers=hdrs
            )
        except _NATS_ERRORS as err:
            raise translate(err, f"publish to {self.name}") from err
        return PubAck(stream=self.name, seq=seq, duplicate=duplicate)

    async def info(self) -> StreamState:
        """Current counts of the stream."""
        try:
            info = await self._js.stream_info(self.name)
        except _NATS_ERRORS as err:
            raise translate(err, f"stream {self.name}") from err
        return stream_state(self.name, info)

    async def purge(self, *, subject: str | None = None) -> int:
        """Remove all messages, or those on ``subject``; returns how many were removed."""
        payload: dict[str, Any] = {"filter": subject} if subject else {}
        try:
            # purge_stream() hides the count; the raw API call returns it.
            resp = await self._js._api_request(
                f"{self._js._prefix}.STREAM.PURGE.{self.name}", _json(payload), timeout=self._timeout
            )
        except _NATS_ERRORS as err:
            raise translate(err, f"purge {self.name}") from err
        return int(resp.get("purged", 0))

    async def delete_msg(self, seq: int) -> bool:
        """Remove one message."""
        try:
            await self._js.delete_msg(self.name, seq)
        except js_errors.NotFoundError:
            return False
        except js_errors.APIError as err:
            if err.err_code in (10037, 10043):  # no message found, sequence not found
                return False
            if err.err_code == _MSG_DELETE_FAILED and _NO_SUCH_MSG.search(err.description or ""):
                return False  # purged earlier, or past the end of the stream
            raise translate(err, f"delete message {seq} of {self.name}") from err
        except _NATS_ERRORS as err:
            raise translate(err, f"delete message {seq} of {self.name}") from err
        return True

    async def get_last(self, subject: str) -> StoredMsg | None:
        """The newest message on ``subject``, or None."""
        try:
            raw = await self._js.get_last_msg(self.name, subject)
        except js_errors.NotFoundError:
            return None
        except _NATS_ERRORS as err:
            raise translate(err, f"read {subject} from {self.name}") from err
        return StoredMsg(
            subject=raw.subject or subject,
            seq=raw.seq or 0,
            data=raw.data or b"",
            headers=dict(raw.headers or {}),
            time=raw.time,
        )

    async def count_stored(self, first_seq: int, last_seq: int) -> int:
        """Messages still held with a sequence in ``[first_seq, last_seq]`` (range minus interior deletes)."""
        if last_seq < first_seq:
            return 0
        try:
            # stream_info() drops the list of deleted sequences; the raw API call returns it.
            resp = await self._js._api_request(
                f"{self._js._prefix}.STREAM.INFO.{self.name}", _json({"deleted_details": True}), timeout=self._timeout
            )
        except _NATS_ERRORS as err:
            raise translate(err, f"stream {self.name}") from err
        state = resp.get("state") or {}
        lo = max(first_seq, int(state.get("first_seq") or 0))
        hi = min(last_seq, int(state.get("last_seq") or 0))
        if int(state.get("messages") or 0) == 0 or hi < lo:
            return 0
        return hi - lo + 1 - sum(1 for seq in state.get("deleted") or () if lo <= seq <= hi)

    async def delete(self) -> bool:
        """Remove the stream itself."""
        try:
            return bool(await self._js.delete_stream(self.name))
        except js_errors.NotFoundError:
            return False
        except _NATS_ERRORS as err:
            raise translate(err, f"delete stream {self.name}") from err

    async def ensure_consumer(self, spec: ConsumerSpec) -> ConsumerState:
        """Create or update a durable consumer."""
        try:
            return _consumer_state(await self._js.add_consumer(self.name, config=consumer_config(spec)))
        except js_errors.APIError as err:
            if err.err_code in (STREAM_NOT_FOUND,):
                raise NotFound(f"stream {self.name}: not found") from err
            raise SpecConflict(f"consumer {spec.durable} on {self.name}: {err.description}") from err
        except _NATS_ERRORS as err:
            raise translate(err, f"consumer {spec.durable} on {self.name}") from err

    async def consumer_info(self, durable: str) -> ConsumerState:
        """Snapshot of a consumer."""
        try:
            return _consumer_state(await self._js.consumer_info(self.name, durable))
        except _NATS_ERRORS as err:
            raise translate(err, f"consumer {durable} on {self.name}") from err

    async def delete_consumer(self, durable: str) -> bool:
        """Remove a consumer."""
        try:
            return bool(await self._js.delete_consumer(self.name, durable))
        except js_errors.NotFoundError:
            return False
        except _NATS_ERRORS as err:
            raise translate(err, f"delete consumer {durable} on {self.name}") from err

    @asynccontextmanager
    async def consume(
        self, durable: str, *, batch: int = 16, max_inflight: int = 64, fetch_timeout: float = 5.0
    ) -> AsyncIterator[NatsConsumer]:
        """Bind to an existing durable and hand out its deliveries."""
        if batch < 1 or max_inflight < 1:
            raise ValueError("batch and max_inflight must be at least 1")
        consumer = NatsConsumer(
            self._js, self.name, durable, batch=batch, max_inflight=max_inflight, fetch_timeout=fetch_timeout
        )
        try:
            await self._js.consumer_info(self.name, durable)
            await consumer.open()
        except _NATS_ERRORS as err:
            raise translate(err, f"consumer {durable} on {self.name}") from err
        try:
            yield consumer
        finally:
            # A stopped consumer may wait for its pull requests (fetch_timeout) before giving back.
            with anyio.move_on_after(self._timeout + fetch_timeout + 1.0, shield=True):
                await consumer.close()


def _json(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload).encode()


def _ack_fields(reply: str) -> tuple[int, int, int, int, int]:
    """(times delivered, stream sequence, consumer sequence, stored at in ns, pending) of a delivery's
    ack subject: ``$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ns>.<pending>``, or the
    newer form with a domain and an account hash before the stream (and a token after).
    """
    tokens = reply.split(".") if reply else []
    if len(tokens) == 9:
        at = 4
    elif len(tokens) >= 11:
        at = 6
    else:
        at = -1
    if at < 0 or tokens[0] != "$JS" or tokens[1] != "ACK":
        raise BusError(f"not a JetStream delivery (its reply subject is {reply!r})")
    try:
        return int(tokens[at]), int(tokens[at + 1]), int(tokens[at + 2]), int(tokens[at + 3]), int(tokens[at + 4])
    except ValueError:
        raise BusError(f"not a JetStream delivery (its reply subject is {reply!r})") from None


@final
class NatsDelivery:
    """One JetStream delivery; settling it frees its in-flight slot."""

    __slots__ = ("_consumer", "_msg", "_settled", "_timestamp_ns", "ack_subject", "consumer_seq", "data", "headers",
                 "num_delivered", "num_pending", "stream_seq", "subject")  # fmt: skip

    def __init__(self, msg: NatsMsg, consumer: NatsConsumer) -> None:
        self._msg = msg
        self._consumer = consumer
        self._settled = False
        self.subject: str = msg.subject
        self.ack_subject: str = msg.reply
        self.data: bytes = msg.data
        self.headers: Headers = msg.headers or {}
        # Read from the ack subject here: nats-py's metadata builds two dataclasses and a datetime for
        # every delivery, a cost on every invocation for a timestamp nothing on that path reads.
        delivered, stream_seq, consumer_seq, stamp, pending = _ack_fields(msg.reply)
        self.num_delivered: int = delivered
        self.stream_seq: int = stream_seq
        self.consumer_seq: int = consumer_seq
        self._timestamp_ns = stamp
        self.num_pending: int = pending

    @property
    def timestamp(self) -> datetime | None:
        """When the message was stored."""
        return datetime.fromtimestamp(self._timestamp_ns / 1e9, UTC)

    def _settle(self) -> None:
        if not self._settled:
            self._settled = True
            self._consumer._release()

    async def ack(self) -> None:
        """Done."""
        try:
            await self._msg.ack()
        except _NATS_ERRORS as err:
            raise translate(err, "ack") from err
        finally:
            self._settle()

    async def ack_sync(self, *, timeout: float | None = None) -> None:
        """Done, confirmed by the server."""
        try:
            await self._msg.ack_sync(timeout=timeout or 5.0)
        except _NATS_ERRORS as err:
            raise translate(err, "ack") from err
        finally:
            self._settle()

    async def nak(self, delay: float | None = None) -> None:
        """Redeliver, optionally after ``delay`` seconds."""
        try:
            await self._msg.nak(delay=delay)
        except _NATS_ERRORS as err:
            raise translate(err, "nak") from err
        finally:
            self._settle()

    async def in_progress(self) -> None:
        """Restart the ack-wait timer."""
        try:
            await self._msg.in_progress()
        except _NATS_ERRORS as err:
            raise translate(err, "in_progress") from err

    async def term(self) -> None:
        """Never redeliver."""
        try:
            await self._msg.term()
        except _NATS_ERRORS as err:
            raise translate(err, "term") from err
        finally:
            self._settle()

    def hand_off(self) -> None:
        """Settled elsewhere from now on: its in-flight slot is free."""
        self._settle()


#: How long a consumer waits before asking again when a pull request was refused or could not be sent.
REFUSED_PAUSE = 0.25


@final
class NatsConsumer:
    """Hands out a durable's deliveries from lingering pull requests, never more than ``max_inflight`` unsettled.

    The pull requests ask for what the free slots can take and stay open on the server for
    ``fetch_timeout`` (their ``expires``), so a quiet consumer costs one pull request per
    ``fetch_timeout`` and a busy one about one per ``batch / 2`` deliveries, instead of a request
    and a "no messages" answer per fetch. What was asked for and not delivered yet is counted
    (``outstanding``): the server's 408 at a pull's expiry says how much of it was never delivered;
    when nothing at all is heard after every pull expired (a reconnect, a leader change), the count is
    started again.
    """

    def __init__(
        self, js: JetStreamContext, stream: str, durable: str, *, batch: int, max_inflight: int, fetch_timeout: float
    ) -> None:
        self._nc = js._nc  # nats-py keeps the client it was made from here
        self._next = f"{js._prefix}.CONSUMER.MSG.NEXT.{stream}.{durable}"
        self._what = f"consumer {durable} on {stream}"
        self._inbox = self._nc.new_inbox()
        self._sub: Subscription | None = None
        self._batch = batch
        self._max_inflight = max_inflight
        self._fetch_timeout = fetch_timeout
        self._buffer: deque[NatsMsg] = deque()
        self._in_flight = 0
        self._delivered = 0
        #: Asked for by open pull requests and not delivered yet; they all expire by ``_quiet_after``.
        self._outstanding = 0
        self._quiet_after = 0.0
        self._error: BusError | None = None
        #: No pull requests before this (the server refused one).
        self._paused_until = 0.0
        #: Set when a message arrives or a slot is freed.
        self._changed = Wakeup()
        #: :meth:`stop` was called: no more pull requests, and :meth:`close` outlasts the open ones.
        self._stopped = False

    async def open(self) -> None:
        self._sub = await self._nc.subscribe(self._inbox, cb=self._on_message)

    def stop(self) -> None:
        self._stopped = True

    async def close(self) -> None:
        """Stop listening, then give back what was received and never handed out.

        The server sends a waiting pull request's messages to its inbox without asking whether anyone
        still listens there, so a message it sends as the consumer unsubscribes is lost here and waits
        out ack_wait. A stopped consumer therefore first waits for its open pull requests to be filled
        or expire, holding what arrives (a message given back at once could come straight back to those
        requests, and count a delivery each time). Then it drains (what the server sent before it heard
        of the unsubscribe is still received) and gives everything back.
        """
        while self._stopped and self._outstanding and self._sub is not None:
            left = self._quiet_after - time.monotonic()
            if left <= 0:
                break
            self._changed.clear()
            await self._changed.wait(left)
        if self._sub is not None:
            with contextlib.suppress(nats.errors.Error, OSError):
                await self._sub.drain()  # type: ignore[no-untyped-call]  # nats-py leaves it untyped
        await self.release_buffered()

    def _release(self) -> None:
        self._in_flight -= 1
        self._changed.set()

    async def release_buffered(self) -> None:
        """Give back what was received but never handed out, for redelivery now rather than after ack_wait."""
        while self._buffer:
            msg = self._buffer.popleft()
            try:
                await msg.nak()
            except _NATS_ERRORS:
                return

    def statistics(self) -> ConsumerStatistics:
        """Unsettled deliveries and totals."""
        return ConsumerStatistics(in_flight=self._in_flight, max_inflight=self._max_inflight, delivered=self._delivered)

    async def _on_message(self, msg: NatsMsg) -> None:
        self._quiet_after = max(self._quiet_after, time.monotonic() + 1.0)
        status = msg.headers.get(api.Header.STATUS) if msg.headers else None
        if not status:
            self._outstanding = max(0, self._outstanding - 1)
            self._buffer.append(msg)
        elif status in ("408", "409", "503"):
            # A pull request ended: expired (408), refused or cut short (409), or nobody took it (503: no
            # consumer leader right now); what it never delivered.
            left = msg.headers.get("Nats-Pending-Messages") if msg.headers else None
            self._outstanding = max(0, self._outstanding - int(left)) if left and left.isdigit() else 0
            description = (msg.headers or {}).get(api.Header.DESCRIPTION, "")
            if "deleted" in description.lower():
                self._error = NotFound(f"{self._what}: {description}")
            elif status != "408":
                # Ask again after a pause, not at once (too many waiting pulls, a leader change).
                self._paused_until = time.monotonic() + REFUSED_PAUSE
        self._changed.set()

    # A class iterator rather than an async generator: a cancelled __anext__ (a timeout around one
    # step) leaves the consumer usable, where a generator would be finished for good.
    def __aiter__(self) -> NatsConsumer:
        return self

    async def __anext__(self) -> NatsDelivery:
        # A delivery is in flight from the moment it is handed out. Pulls are sized to the free
        # slots, but one cut short can leave more delivered than asked for, so the bound is
        # enforced here.
        while not (self._buffer and self._in_flight < self._max_inflight):
            if self._error is not None:
                raise self._error
            self._changed.clear()  # before anything that yields: no wake-up is missed
            if self._in_flight < self._max_inflight:
                await self._ask()
            if self._buffer and self._in_flight < self._max_inflight:
                break
            paused = self._paused_until - time.monotonic()
            await self._changed.wait(paused if paused > 0 else self._fetch_timeout + 1.0)
            if self._outstanding and time.monotonic() > self._quiet_after:
                self._outstanding = 0  # every pull has expired unheard: the server no longer has them
        delivery = NatsDelivery(self._buffer.popleft(), self)
        self._in_flight += 1
        self._delivered += 1
        return delivery

    async def _ask(self) -> None:
        """A pull request for the free slots, unless enough is asked for already."""
        if self._stopped:
            return
        free = self._max_inflight - self._in_flight - len(self._buffer) - self._outstanding
        if free <= 0 or (self._outstanding and free < max(1, self._batch // 2)):
            return
        if time.monotonic() < self._paused_until:
            return
        want = min(free, self._batch)
        expires = int(self._fetch_timeout * 1_000_000_000)
        try:
            await self._nc.publish(self._next, orjson.dumps({"batch": want, "expires": expires}), reply=self._inbox)
        except _NATS_ERRORS as err:
            if isinstance(err, nats.errors.ConnectionClosedError):
                raise translate(err, "fetch") from err
            await anyio.sleep(REFUSED_PAUSE)  # reconnecting: ask again shortly
            return
        self._outstanding += want
        self._quiet_after = time.monotonic() + self._fetch_timeout + 1.0
