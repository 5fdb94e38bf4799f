"""The NATS implementation of the bus (nats-py), opened as an async context manager."""

from __future__ import annotations

import logging
import ssl
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, final

import anyio
import anyio.lowlevel
import attrs
import nats
import nats.errors
import nats.js
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg as NatsMsg
from nats.aio.subscription import Subscription as NatsSubscription
from nats.aio.transport import TcpTransport

from nvcf_mono.bus.api import (
    ERROR_HEADER,
    BucketSpec,
    BusEvent,
    BusStatistics,
    ConnectionState,
    Handler,
    Headers,
    KeyValue,
    Msg,
    ObjectStore,
    ObjectStoreSpec,
    StoreUsage,
    StreamSpec,
    StreamState,
)
from nvcf_mono.bus.errors import BusError, BusUnavailable, NoResponders, RemoteError, RequestTimeout
from nvcf_mono.bus.handed import NAK
from nvcf_mono.bus.jetstream import (
    NatsStream,
    ensure_stream_config,
    store_usage,
    stream_config,
    stream_names,
    stream_state,
    stream_states,
)
from nvcf_mono.bus.kv import NatsKeyValue, bucket_stream_config
from nvcf_mono.bus.objects import NatsObjectStore, object_store_stream_config
from nvcf_mono.bus.replies import Replies
from nvcf_mono.config.model import BusSettings
from nvcf_mono.log import Throttle
from nvcf_mono.metrics import Metrics

_EVENT_BUFFER = 64


def _to_msg(msg: NatsMsg) -> Msg:
    return Msg(subject=msg.subject, data=msg.data, headers=msg.headers or {}, reply=msg.reply or None)


@final
class CoreSubscription:
    """A core subscription read without callbacks, straight from nats-py's pending queue."""

    def __init__(self, sub: NatsSubscription, subject: str) -> None:
        self._sub = sub
        self.subject = subject
        self._dropped = 0
        # nats-py's own next_msg() spawns a task per message; reading the queue directly is the
        # same thing without that cost. Checked here so an incompatible nats-py fails loudly.
        self._queue = sub._pending_queue

    def __aiter__(self) -> CoreSubscription:
        return self  # a class iterator survives a cancelled step, unlike an async generator

    async def __anext__(self) -> Msg:
        return await self._take()

    async def _take(self) -> Msg:
        msg: NatsMsg = await self._queue.get()
        self._sub._pending_size -= len(msg.data)
        self._queue.task_done()
        return _to_msg(msg)

    def _note_dropped(self) -> None:
        self._dropped += 1

    async def next(self, *, timeout: float) -> Msg:
        """The next message, or RequestTimeout after ``timeout`` seconds."""
        with anyio.move_on_after(timeout):
            return await self._take()
        raise RequestTimeout(f"no message on {self.subject!r} within {timeout:g}s")

    @property
    def dropped(self) -> int:
        """Messages dropped for this subscription because it fell behind (its pending queue was full)."""
        return self._dropped


@attrs.define
class _Events:
    """Fan-out of connection events to whoever listens; a slow listener loses the oldest."""

    listeners: list[tuple[MemoryObjectSendStream[BusEvent], MemoryObjectReceiveStream[BusEvent]]] = attrs.field(
        factory=list
    )
    dropped: int = 0

    def emit(self, event: BusEvent) -> None:
        for listener in list(self.listeners):
            send, receive = listener
            try:
                try:
                    send.send_nowait(event)
                except anyio.WouldBlock:
                    receive.receive_nowait()  # full: make room by dropping the oldest event
                    self.dropped += 1
                    send.send_nowait(event)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                self.listeners.remove(listener)


@final
class NatsBus:
    """The bus over one nats-py connection. Create it with :func:`open_nats_bus`."""

    def __init__(self, nc: NatsClient, settings: BusSettings, metrics: Metrics, log: logging.Logger) -> None:
        self._nc = nc
        self._js = nc.jetstream(timeout=settings.request_timeout)
        self._replies = Replies(nc)
        self._settings = settings
        self._log = log
        self._events = _Events()
        self._kv: dict[str, NatsKeyValue] = {}
        self._objects: dict[str, NatsObjectStore] = {}
        self._streams: dict[str, NatsStream] = {}
        self._core_subs: dict[int, CoreSubscription] = {}  # by sid, to count what nats-py drops
        self.connects = metrics.counter("nats_connects", "Connections and reconnections to NATS.")
        self.disconnects = metrics.counter("nats_event_disconnected", "Times the NATS connection was lost.")
        self.errors = metrics.counter("total_nats_errors", "Errors reported by the NATS connection.", ["kind"])
        connected = metrics.gauge("nats_connected", "1 while the bus is connected to NATS.")
        connected.set_function(lambda: [((), 1.0 if self._nc.is_connected else 0.0)])
        for name, key, help_ in (
            ("nats_in_messages", "in_msgs", "Messages received from NATS."),
            ("nats_out_messages", "out_msgs", "Messages sent to NATS."),
            ("nats_in_bytes", "in_bytes", "Bytes received from NATS."),
            ("nats_out_bytes", "out_bytes", "Bytes sent to NATS."),
        ):
            # Running totals: counters (a gauge would tell Prometheus they may go down).
            metrics.counter(name, help_).set_function(self._stat_reader(key))

    def _stat_reader(self, key: str) -> Callable[[], list[tuple[tuple[str, ...], float]]]:
        return lambda: [((), float(self._nc.stats[key]))]

    # ---- connection ------------------------------------------------------------------------------

    @property
    def state(self) -> ConnectionState:
        """Where the connection stands now."""
        if self._nc.is_closed:
            return ConnectionState.CLOSED
        if self._nc.is_connected:
            return ConnectionState.CONNECTED
        # The bus exists once its first connection is made, so anything else is a reconnection, also
        # while nats-py says "connecting" (it does during the handshake with the server it reached).
        return ConnectionState.RECONNECTING

    @property
    def max_payload(self) -> int:
        """The largest message the server takes (what it announced; NATS's default before it did)."""
        return int(self._nc.max_payload or 1024 * 1024)

    @property
    def client(self) -> NatsClient:
        """The nats-py client, for adapters that need what the interface does not offer."""
        return self._nc

    def statistics(self) -> BusStatistics:
        """Counters of this connection."""
        stats = self._nc.stats
        return BusStatistics(
            state=self.state,
            connected_url=self._nc.connected_url.netloc if self._nc.connected_url else None,
            reconnects=int(stats["reconnects"]),
            in_msgs=int(stats["in_msgs"]),
            out_msgs=int(stats["out_msgs"]),
            in_bytes=int(stats["in_bytes"]),
            out_bytes=int(stats["out_bytes"]),
            errors=int(stats["errors_received"]),
        )

    async def usage(self) -> StoreUsage:
        """JetStream's use of the store by this account."""
        return await store_usage(self._js, self._settings.request_timeout)

    @asynccontextmanager
    async def events(self) -> AsyncIterator[AsyncIterator[BusEvent]]:
        """Connection events from now on."""
        send, receive = anyio.create_memory_object_stream[BusEvent](_EVENT_BUFFER)
        listener = (send, receive)
        self._events.listeners.append(listener)
        try:
            async with receive:
                yield receive
        finally:
            if listener in self._events.listeners:
                self._events.listeners.remove(listener)
            send.close()

    # Callbacks nats-py invokes; they only record and report (no work happens here).
    async def on_disconnected(self) -> None:
        self.disconnects.inc()
        if not self._nc.is_closed:
            self._log.warning("lost the NATS connection; reconnecting")
        self._events.emit(BusEvent(kind="disconnected"))

    async def on_reconnected(self) -> None:
        self.connects.inc()
        url = self._nc.connected_url.netloc if self._nc.connected_url else "?"
        self._log.info("reconnected to NATS at %s", url.rsplit("@", 1)[-1])
        self._events.emit(BusEvent(kind="reconnected", detail=url))

    async def on_error(self, err: Exception) -> None:
        kind = type(err).__name__
        self.errors.inc(kind=kind)
        if isinstance(err, nats.errors.SlowConsumerError):
            core = self._core_subs.get(err.sid)
            if core is not None:
                core._note_dropped()
            self._events.emit(BusEvent(kind="slow_consumer", detail=str(err.subject)))
            self._log.warning("slow consumer on %s: messages dropped", err.subject)
            return
        self._log.debug("NATS connection error: %s: %s", kind, err)
        self._events.emit(BusEvent(kind="error", detail=f"{kind}: {err}"))

    async def on_closed(self) -> None:
        self._events.emit(BusEvent(kind="closed"))

    # ---- core ------------------------------------------------------------------------------------

    async def publish(
        self, subject: str, data: bytes = b"", *, headers: Headers | None = None, reply: str | None = None
    ) -> None:
        """Fire and forget; buffered by the client while reconnecting."""
        try:
            await self._nc.publish(subject, data, reply=reply or "", headers=dict(headers) if headers else None)
        except nats.errors.ConnectionClosedError as err:
            raise BusUnavailable("the bus connection is closed") from err
        except nats.errors.OutboundBufferLimitError as err:
            raise BusUnavailable("disconnected and the reconnect buffer is full") from err

    async def request(
        self, subject: str, data: bytes = b"", *, timeout: float | None = None, headers: Headers | None = None
    ) -> Msg:
        """One request, one reply."""
        deadline = timeout if timeout is not None else self._settings.request_timeout
        try:
            reply = await self._replies.request(subject, data, timeout=deadline, headers=headers)
        except nats.errors.NoRespondersError as err:
            raise NoResponders(f"nobody serves {subject!r}") from err
        except nats.errors.TimeoutError as err:
            raise RequestTimeout(f"no reply on {subject!r} within {deadline:g}s") from err
        except nats.errors.ConnectionClosedError as err:
            raise BusUnavailable("the bus connection is closed") from err
        msg = _to_msg(reply)
        error = msg.headers.get(ERROR_HEADER)
        if error is not None:
            raise RemoteError(error)
        return msg

    @asynccontextmanager
    async def subscribe(
        self, subject: str, *, queue: str | None = None, max_pending: int = 4096
    ) -> AsyncIterator[CoreSubscription]:
        """Subscribe for the duration of the context."""
        try:
            sub = await self._nc.subscribe(subject, queue=queue or "", pending_msgs_limit=max_pending)
        except nats.errors.ConnectionClosedError as err:
            raise BusUnavailable("the bus connection is closed") from err
        core = self._core_subs[sub._id] = CoreSubscription(sub, subject)
        try:
            yield core
        finally:
            self._core_subs.pop(sub._id, None)
            with anyio.move_on_after(self._settings.request_timeout, shield=True):
                try:
                    await sub.unsubscribe()
                except (nats.errors.ConnectionClosedError, nats.errors.BadSubscriptionError):
                    pass

    async def serve(
        self,
        subject: str,
        handler: Handler,
        *,
        queue: str | None = None,
        concurrency: int = 16,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Answer requests until cancelled; at most ``concurrency`` handlers run at once."""
        slots = anyio.Semaphore(concurrency)

        async def answer(msg: Msg) -> None:
            try:
                try:
                    result = await handler(msg)
                except anyio.get_cancelled_exc_class():
                    raise
                except Exception as err:
                    self._log.exception("handler for %s failed", subject)
                    if msg.reply:
                        await self.publish(msg.reply, b"", headers={ERROR_HEADER: f"{type(err).__name__}: {err}"})
                    return
                if msg.reply:
                    await self.publish(msg.reply, result)
            except BusError as err:
                self._log.warning("could not answer a request on %s: %s", subject, err)
            finally:
                slots.release()

        async with self.subscribe(subject, queue=queue) as sub, anyio.create_task_group() as tg:
            task_status.started()
            async for msg in sub:
                await slots.acquire()
                tg.start_soon(answer, msg, name=f"bus:serve:{subject}")

    async def give_back(self, ack_subject: str) -> None:
        """A nak on another connection's delivery (JetStream acks are plain publishes to its reply subject)."""
        await self.publish(ack_subject, NAK)

    async def flush(self, *, timeout: float | None = None) -> None:
        """Round trip to the server."""
        deadline = timeout if timeout is not None else self._settings.request_timeout
        try:
            await self._nc.flush(timeout=deadline)  # type: ignore[arg-type]
        except nats.errors.TimeoutError as err:
            raise RequestTimeout(f"flush not confirmed within {deadline:g}s") from err
        except nats.errors.ConnectionClosedError as err:
            raise BusUnavailable("the bus connection is closed") from err

    # ---- JetStream -------------------------------------------------------------------------------

    def _defaults(self) -> tuple[str, int]:
        return self._settings.storage, self._settings.stream_replicas

    async def ensure_stream(self, spec: StreamSpec) -> StreamState:
        """Create or update the stream to match ``spec``."""
        return stream_state(spec.name, await ensure_stream_config(self._js, stream_config(spec, *self._defaults())))

    def stream(self, name: str) -> NatsStream:
        """A handle on a stream (no I/O)."""
        handle = self._streams.get(name)
        if handle is None:
            handle = self._streams[name] = NatsStream(self._js, self._replies, name, self._settings.request_timeout)
        return handle

    async def delete_stream(self, name: str) -> bool:
        """Remove a stream (and forget its handle: handles stay as many as the streams in use)."""
        try:
            return await self.stream(name).delete()
        finally:
            self._streams.pop(name, None)

    async def stream_names(self, subject: str | None = None) -> list[str]:
        """Names of the streams that store ``subject`` (every stream when None)."""
        return await stream_names(self._js, subject, self._settings.request_timeout)

    async def stream_states(self, subject: str) -> dict[str, StreamState]:
        """The counts of every stream that stores ``subject``, by name (a call per 256 streams)."""
        return await stream_states(self._js, subject, self._settings.request_timeout)

    async def ensure_bucket(self, spec: BucketSpec) -> KeyValue:
        """Create or update a KV bucket."""
        config = await bucket_stream_config(
            self._js, spec, *self._defaults(), marker_ttl=self._settings.deleted_key_ttl
        )
        await ensure_stream_config(self._js, config)
        return self.kv(spec.name)

    def kv(self, bucket: str) -> NatsKeyValue:
        """A handle on a bucket (no I/O)."""
        handle = self._kv.get(bucket)
        if handle is None:
            handle = self._kv[bucket] = NatsKeyValue(
                self._js,
                self._replies,
                bucket,
                self._settings.request_timeout,
                deleted_ttl=self._settings.deleted_key_ttl,
            )
        return handle

    async def ensure_object_store(self, spec: ObjectStoreSpec) -> ObjectStore:
        """Create or update an object store bucket."""
        await ensure_stream_config(self._js, object_store_stream_config(spec, *self._defaults()))
        return self.objects(spec.name)

    def objects(self, bucket: str) -> NatsObjectStore:
        """A handle on an object store (no I/O)."""
        handle = self._objects.get(bucket)
        if handle is None:
            handle = self._objects[bucket] = NatsObjectStore(
                self._js,
                self._replies,
                bucket,
                self._settings.request_timeout,
                deleted_ttl=self._settings.deleted_key_ttl,
            )
        return handle


def _tls_context(settings: BusSettings, servers: Sequence[str]) -> ssl.SSLContext | None:
    tls = settings.tls
    wants_tls = tls.enabled or any(u.strip().startswith(("tls://", "wss://")) for u in servers)
    if not wants_tls:
        return None
    context = ssl.create_default_context(cafile=str(tls.ca_file) if tls.ca_file else None)
    if tls.cert_file is not None and tls.key_file is not None:
        context.load_cert_chain(str(tls.cert_file), str(tls.key_file))
    return context


def _redact(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    return f"{scheme}{sep}{rest.rsplit('@', 1)[-1]}" if sep else url


class _ConnectionEvents:
    """nats-py's callbacks, passed on to the bus once it exists (before: connection errors, logged now and then)."""

    def __init__(self, servers: Sequence[str], log: logging.Logger) -> None:
        self.client: NatsClient | None = None
        self.bus: NatsBus | None = None
        self._servers = servers
        self._log = log
        self._unreachable = Throttle(burst=1, interval=10.0)

    async def error(self, err: Exception) -> None:
        client = self.client
        if (
            client is not None
            and client.is_connecting
            and (client._reading_task is None or client._reading_task.done())
        ):
            # A handshake failed (each failed reconnection attempt ends here): nats-py's next attempt
            # would replace its socket without closing it.
            _close_socket(client)
        if self.bus is not None:
            await self.bus.on_error(err)
        else:
            where = ", ".join(_redact(s) for s in self._servers)
            self._unreachable.log(
                self._log, logging.WARNING, "cannot reach NATS at %s yet: %s", where, err or type(err)
            )

    async def disconnected(self) -> None:
        if self.bus is not None:
            await self.bus.on_disconnected()

    async def reconnected(self) -> None:
        if self.bus is not None:
            await self.bus.on_reconnected()

    async def closed(self) -> None:
        if self.bus is not None:
            await self.bus.on_closed()


def _connect_options(
    settings: BusSettings,
    servers: Sequence[str],
    name: str,
    events: _ConnectionEvents,
    *,
    token: str | None,
    inbox_prefix: str,
) -> dict[str, Any]:
    """``nats.connect``'s arguments."""
    options: dict[str, Any] = {
        "servers": list(servers),
        "name": name,
        "connect_timeout": settings.connect_timeout,
        "reconnect_time_wait": settings.reconnect_wait,
        "max_reconnect_attempts": settings.max_reconnect_attempts,
        "ping_interval": settings.ping_interval,
        "max_outstanding_pings": 3,
        "pending_size": settings.reconnect_buffer,
        "drain_timeout": settings.drain_timeout,
        "allow_reconnect": True,
        "error_cb": events.error,
        "disconnected_cb": events.disconnected,
        "reconnected_cb": events.reconnected,
        "closed_cb": events.closed,
    }
    tls = _tls_context(settings, servers)
    if tls is not None:
        options["tls"] = tls
    if settings.credentials_file is not None:
        options["user_credentials"] = str(settings.credentials_file)
    if token is not None:
        options["token"] = token
    if inbox_prefix:
        options["inbox_prefix"] = inbox_prefix
    return options


@asynccontextmanager
async def open_nats_bus(
    settings: BusSettings,
    *,
    servers: Sequence[str],
    name: str,
    metrics: Metrics,
    log: logging.Logger,
    token: str | None = None,
    inbox_prefix: str = "",
) -> AsyncIterator[NatsBus]:
    """Connect (retrying for ``settings.connect_retry_for``), yield the bus, drain it on exit.

    ``token`` is a connect token (workers present an auth-callout envelope with it);
    ``inbox_prefix`` replaces ``_INBOX`` for this connection's replies and pulls (a worker may
    subscribe under its own prefix only).
    """
    events = _ConnectionEvents(servers, log)
    options = _connect_options(settings, servers, name, events, token=token, inbox_prefix=inbox_prefix)

    nc = events.client = NatsClient()
    # nats-py keeps retrying a failed first connection internally; the deadline is ours.
    try:
        try:
            with anyio.fail_after(settings.connect_retry_for):
                await nc.connect(**options)
        except BaseException:
            await _close(nc, settings.connect_timeout)
            raise
    except TimeoutError as err:
        where = ", ".join(_redact(s) for s in servers)
        raise BusUnavailable(f"could not connect to NATS at {where} within {settings.connect_retry_for:g}s") from err
    except (nats.errors.Error, OSError) as err:
        raise BusUnavailable(f"could not connect to NATS: {err}") from err

    bus = events.bus = NatsBus(nc, settings, metrics, log)
    bus.connects.inc()
    log.info("connected to NATS at %s", _redact(nc.connected_url.geturl()) if nc.connected_url else "?")
    try:
        yield bus
    finally:
        with anyio.move_on_after(settings.drain_timeout + 1, shield=True):
            try:
                if nc.is_connected:
                    await nc.drain()
            except (nats.errors.Error, OSError) as err:
                log.debug("draining the NATS connection: %s", err)
        await _close(nc, settings.connect_timeout)


async def _close(nc: NatsClient, timeout: float) -> None:
    """Close ``nc`` however far its connect, drain or close got.

    nats-py marks a client closed before its close awaits anything, so a close cut short (by a deadline,
    or a connect cancelled mid-handshake, which nats-py does not clean up) would leave the socket and the
    client's tasks to the garbage collector, perhaps after the event loop has gone.
    """
    with anyio.move_on_after(timeout, shield=True):
        try:
            await nc.close()
        except (nats.errors.Error, OSError):
            pass  # closing anyway, below
    for task in (nc._reading_task, nc._ping_interval_task, nc._flusher_task, nc._reconnection_task):
        if task is not None:
            task.cancel()
    _close_socket(nc)
    with anyio.CancelScope(shield=True):
        await anyio.lowlevel.checkpoint()  # the loop closes an aborted socket on its next turn


def _close_socket(nc: NatsClient) -> None:
    """Abort the connection nats-py holds for ``nc`` (if not closed already), dropping what is unsent."""
    transport = nc._transport
    # TCP (with or without TLS) is the only transport the bus uses: no websockets.
    if isinstance(transport, TcpTransport) and transport._io_writer is not None:
        transport._io_writer.transport.abort()
