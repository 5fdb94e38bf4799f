"""The bus interface: value types, declared specs, and the protocols plugins program against.

Core NATS is at-most-once (publish, request, subscribe); JetStream is at-least-once (streams with
durable pull consumers whose deliveries are acked, nak'd, kept in progress or terminated); KV buckets
give revisions (compare-and-set) and watches; the object store holds payloads too large for a message.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from datetime import datetime
from typing import Literal, Protocol

import attrs
from anyio.abc import TaskStatus

Headers = Mapping[str, str]
StorageKind = Literal["file", "memory"]

#: Reply header that carries a responder's error (see :meth:`Bus.serve`).
ERROR_HEADER = "Nvcf-Error"


class Retention(enum.Enum):
    """What removes messages from a stream."""

    LIMITS = "limits"
    WORK_QUEUE = "workqueue"
    INTEREST = "interest"


class Discard(enum.Enum):
    """What a full stream does with a new message."""

    OLD = "old"
    NEW = "new"


class DeliverPolicy(enum.Enum):
    """Where a new consumer starts."""

    ALL = "all"
    NEW = "new"
    LAST = "last"
    LAST_PER_SUBJECT = "last_per_subject"


@attrs.frozen(kw_only=True)
class StreamSpec:
    """A JetStream stream as declared in ``setup()``; ensured idempotently when the host starts."""

    name: str
    subjects: tuple[str, ...]
    description: str = ""
    retention: Retention = Retention.LIMITS
    storage: StorageKind | None = None  # None: the bus default (bus.storage)
    replicas: int | None = None  # None: the bus default (bus.stream_replicas)
    max_msgs: int = -1
    max_bytes: int = -1
    max_age: float = 0.0  # seconds; 0 keeps messages forever
    max_msg_size: int = -1
    max_msgs_per_subject: int = -1
    discard: Discard = Discard.OLD
    discard_new_per_subject: bool = False
    duplicate_window: float = 120.0  # seconds during which a msg-id is remembered
    allow_direct: bool = True
    allow_msg_ttl: bool = False


@attrs.frozen(kw_only=True)
class ConsumerSpec:
    """A durable pull consumer."""

    durable: str
    filter_subjects: tuple[str, ...] = ()
    description: str = ""
    deliver_policy: DeliverPolicy = DeliverPolicy.ALL
    ack_wait: float = 30.0  # seconds before an unacked delivery is redelivered
    max_deliver: int = -1
    max_ack_pending: int = 1000
    max_waiting: int = 512
    backoff: tuple[float, ...] = ()  # redelivery delays in seconds; overrides ack_wait per attempt
    inactive_threshold: float | None = None  # seconds; None keeps the durable forever


@attrs.frozen(kw_only=True)
class BucketSpec:
    """A KV bucket."""

    name: str
    description: str = ""
    history: int = 1
    ttl: float = 0.0  # seconds every value lives; 0 forever
    per_key_ttl: bool = False  # allow put/create(..., ttl=) and report expiries to watchers
    max_value_size: int = -1
    max_bytes: int = -1
    storage: StorageKind | None = None
    replicas: int | None = None


@attrs.frozen(kw_only=True)
class ObjectStoreSpec:
    """An object store bucket."""

    name: str
    description: str = ""
    ttl: float = 0.0
    max_bytes: int = -1
    storage: StorageKind | None = None
    replicas: int | None = None


@attrs.frozen(kw_only=True)
class PubAck:
    """JetStream's receipt for a stored message."""

    stream: str
    seq: int
    duplicate: bool = False


@attrs.frozen(kw_only=True)
class StoreUsage:
    """What JetStream holds for the platform's account: bytes used and reserved, streams, consumers."""

    storage: int
    memory: int
    reserved_storage: int
    reserved_memory: int
    streams: int
    consumers: int
    #: The account's JetStream storage limit; None when it has none (the server's own limit applies).
    max_storage: int | None = None


@attrs.frozen(kw_only=True)
class StreamState:
    """A snapshot of a stream."""

    name: str
    messages: int
    bytes: int
    first_seq: int
    last_seq: int
    consumer_count: int


@attrs.frozen(kw_only=True)
class ConsumerState:
    """A snapshot of a durable consumer; ``num_pending`` + ``num_ack_pending`` is the backlog."""

    name: str
    num_pending: int
    num_ack_pending: int
    num_redelivered: int
    num_waiting: int
    delivered_stream_seq: int
    ack_floor_stream_seq: int


@attrs.frozen(kw_only=True)
class StoredMsg:
    """A message read directly from a stream."""

    subject: str
    seq: int
    data: bytes
    headers: Headers
    time: datetime | None


class KvOp(enum.Enum):
    """What a KV entry records."""

    PUT = "PUT"
    DELETE = "DEL"
    PURGE = "PURGE"


@attrs.frozen(kw_only=True)
class Entry:
    """One KV revision."""

    bucket: str
    key: str
    value: bytes
    revision: int
    operation: KvOp = KvOp.PUT
    created: datetime | None = None

    @property
    def deleted(self) -> bool:
        """True for delete and purge markers (including expiries)."""
        return self.operation is not KvOp.PUT


@attrs.frozen(kw_only=True)
class ObjectInfo:
    """Metadata of a stored object."""

    bucket: str
    name: str
    size: int
    chunks: int
    digest: str
    nuid: str
    mtime: datetime | None = None
    description: str = ""
    metadata: Mapping[str, str] = attrs.field(factory=dict)


class ConnectionState(enum.Enum):
    """Where the bus connection stands (a bus is made connected: there is no first "connecting")."""

    CONNECTED = "connected"
    RECONNECTING = "reconnecting"
    CLOSED = "closed"


@attrs.frozen(kw_only=True)
class BusEvent:
    """A change of the connection, for plugins that resynchronise after a reconnect."""

    kind: Literal["disconnected", "reconnected", "error", "closed", "slow_consumer"]
    detail: str = ""


@attrs.frozen(kw_only=True)
class Msg:
    """A core NATS message."""

    subject: str
    data: bytes
    headers: Headers = attrs.field(factory=dict)
    reply: str | None = None


class Subscription(Protocol):
    """Messages of a core subscription, in arrival order; closing the context unsubscribes."""

    subject: str

    def __aiter__(self) -> AsyncIterator[Msg]: ...

    async def next(self, *, timeout: float) -> Msg:
        """The next message; raises :class:`~nvcf_mono.bus.errors.RequestTimeout` after ``timeout``."""
        ...

    @property
    def dropped(self) -> int:
        """Messages lost because this subscriber was too slow (its pending limit was reached)."""
        ...


class Delivery(Protocol):
    """A JetStream message to settle exactly once with ack, nak or term (in_progress extends it)."""

    subject: str
    data: bytes
    headers: Headers
    stream_seq: int
    consumer_seq: int
    num_delivered: int
    num_pending: int
    #: Where its ack or nak goes (another connection may settle it: :meth:`Bus.give_back`).
    ack_subject: str

    @property
    def timestamp(self) -> datetime | None:
        """When the message was stored (None when not known)."""
        ...

    async def ack(self) -> None:
        """Done; never redeliver."""
        ...

    async def ack_sync(self, *, timeout: float | None = None) -> None:
        """Done, and wait until the server has recorded the ack."""
        ...

    async def nak(self, delay: float | None = None) -> None:
        """Not done; redeliver (after ``delay`` seconds)."""
        ...

    async def in_progress(self) -> None:
        """Still working: restart the ack-wait timer."""
        ...

    async def term(self) -> None:
        """Never redeliver, and do not count it as processed."""
        ...

    def hand_off(self) -> None:
        """Another connection settles it from now on (by :attr:`ack_subject`): free its slot here, send nothing."""
        ...


@attrs.frozen(kw_only=True)
class ConsumerStatistics:
    """Local view of a consumer: deliveries handed out but not yet settled."""

    in_flight: int
    max_inflight: int
    delivered: int


class Consumer(Protocol):
    """Deliveries of a durable pull consumer; never more than ``max_inflight`` unsettled at once."""

    def __aiter__(self) -> AsyncIterator[Delivery]: ...

    def statistics(self) -> ConsumerStatistics:
        """Local counters."""
        ...

    def stop(self) -> None:
        """Ask for nothing more. Leaving the block then waits (until the open pull requests are filled or
        expire) for what was asked for, and gives all that arrived back for redelivery at once: nothing
        the server sends a consumer that is going away waits out ``ack_wait``. Without it, leaving is
        quick, and what the server sends in that moment may.
        """
        ...


class Stream(Protocol):
    """A handle on one JetStream stream."""

    name: str

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
        """Store a message; a repeated ``msg_id`` inside the duplicate window is acknowledged, not stored."""
        ...

    async def info(self) -> StreamState:
        """Current counts."""
        ...

    async def purge(self, *, subject: str | None = None) -> int:
        """Remove messages (all, or those on ``subject``); returns how many."""
        ...

    async def delete_msg(self, seq: int) -> bool:
        """Remove one message by sequence; False if it was already gone."""
        ...

    async def get_last(self, subject: str) -> StoredMsg | None:
        """The newest message on ``subject``."""
        ...

    async def count_stored(self, first_seq: int, last_seq: int) -> int:
        """How many messages the stream still holds with a sequence in ``[first_seq, last_seq]``."""
        ...

    async def ensure_consumer(self, spec: ConsumerSpec) -> ConsumerState:
        """Create or update a durable consumer."""
        ...

    async def consumer_info(self, durable: str) -> ConsumerState:
        """Snapshot of a consumer; raises NotFound."""
        ...

    async def delete_consumer(self, durable: str) -> bool:
        """Remove a consumer; False if it did not exist."""
        ...

    def consume(
        self, durable: str, *, batch: int = 16, max_inflight: int = 64, fetch_timeout: float = 5.0
    ) -> AbstractAsyncContextManager[Consumer]:
        """Pull deliveries from an existing durable consumer."""
        ...


class Watch(Protocol):
    """A KV watch: ``initial`` holds the live entries at start; iteration yields later changes."""

    initial: tuple[Entry, ...]
    #: The bucket's newest revision the initial entries account for (deletes included).
    revision: int

    def __aiter__(self) -> AsyncIterator[Entry]: ...


class KeyValue(Protocol):
    """A handle on one KV bucket. Keys are NATS subject tokens joined by '.'."""

    bucket: str

    async def get(self, key: str) -> Entry | None:
        """The current entry, or None when missing or deleted."""
        ...

    async def put(self, key: str, value: bytes, *, ttl: float | None = None) -> int:
        """Write unconditionally; returns the new revision."""
        ...

    async def create(self, key: str, value: bytes, *, ttl: float | None = None) -> int:
        """Write only if the key has no live value; raises ConflictError otherwise."""
        ...

    async def update(self, key: str, value: bytes, *, revision: int, ttl: float | None = None) -> int:
        """Write only if the key is still at ``revision``; raises ConflictError otherwise."""
        ...

    async def delete(self, key: str, *, revision: int | None = None) -> int:
        """Delete (optionally only at ``revision``, else ConflictError); returns the marker's revision."""
        ...

    async def purge(self, key: str) -> None:
        """Delete a key and its history."""
        ...

    async def keys(self, pattern: str = ">") -> list[str]:
        """Live keys matching a subject pattern."""
        ...

    async def last_revision(self) -> int:
        """The bucket's newest revision (0 when empty): a watch that has seen it is current."""
        ...

    def watch(self, pattern: str = ">", *, include_history: bool = False) -> AbstractAsyncContextManager[Watch]:
        """Watch keys matching ``pattern`` (``>`` for all, ``fn.*`` for one level)."""
        ...


class ObjectReader(Protocol):
    """A stored object being read chunk by chunk; the digest is checked after the last chunk."""

    info: ObjectInfo

    def __aiter__(self) -> AsyncIterator[bytes]: ...


class ObjectStore(Protocol):
    """A handle on one object store bucket (NATS object-store layout, so the nats CLI can read it)."""

    bucket: str

    async def put(
        self,
        name: str,
        data: bytes | AsyncIterable[bytes],
        *,
        metadata: Mapping[str, str] | None = None,
        description: str = "",
        chunk_size: int | None = None,
        ttl: float | None = None,
    ) -> ObjectInfo:
        """Store (or replace) an object from bytes or a stream of chunks."""
        ...

    async def get(self, name: str) -> bytes:
        """The whole object; raises NotFound."""
        ...

    def open(self, name: str) -> AbstractAsyncContextManager[ObjectReader]:
        """Read an object incrementally; raises NotFound."""
        ...

    async def info(self, name: str) -> ObjectInfo | None:
        """Metadata, or None if missing."""
        ...

    async def delete(self, name: str) -> bool:
        """Remove; False if it did not exist."""
        ...

    async def list(self) -> list[ObjectInfo]:
        """Every live object."""
        ...


Handler = Callable[[Msg], Awaitable[bytes]]


@attrs.frozen(kw_only=True)
class BusStatistics:
    """Counters of the connection."""

    state: ConnectionState
    connected_url: str | None
    reconnects: int
    in_msgs: int
    out_msgs: int
    in_bytes: int
    out_bytes: int
    errors: int


class Bus(Protocol):
    """Everything a plugin does on NATS goes through this."""

    @property
    def state(self) -> ConnectionState:
        """Connection state now."""
        ...

    @property
    def max_payload(self) -> int:
        """The largest message the server takes (what it announced; NATS's default before it did)."""
        ...

    async def publish(
        self, subject: str, data: bytes = b"", *, headers: Headers | None = None, reply: str | None = None
    ) -> None:
        """Fire and forget (buffered while reconnecting)."""
        ...

    async def request(
        self, subject: str, data: bytes = b"", *, timeout: float | None = None, headers: Headers | None = None
    ) -> Msg:
        """Send and wait for one reply; raises RequestTimeout, NoResponders or RemoteError."""
        ...

    def subscribe(
        self, subject: str, *, queue: str | None = None, max_pending: int = 4096
    ) -> AbstractAsyncContextManager[Subscription]:
        """Subscribe; with ``queue`` each message goes to one member of the group."""
        ...

    async def serve(
        self,
        subject: str,
        handler: Handler,
        *,
        queue: str | None = None,
        concurrency: int = 16,
        task_status: TaskStatus[None],
    ) -> None:
        """Answer requests on ``subject`` until cancelled; a raising handler sends an error reply."""
        ...

    async def give_back(self, ack_subject: str) -> None:
        """Hand a JetStream delivery held by another connection back for redelivery now (a nak by its reply
        subject): what a worker that died held need not wait for its ack wait.
        """
        ...

    async def flush(self, *, timeout: float | None = None) -> None:
        """Wait until the server has seen everything published so far."""
        ...

    async def ensure_stream(self, spec: StreamSpec) -> StreamState:
        """Create the stream or bring it to ``spec``."""
        ...

    def stream(self, name: str) -> Stream:
        """A handle on a stream (no I/O)."""
        ...

    async def delete_stream(self, name: str) -> bool:
        """Remove a stream and its messages."""
        ...

    async def stream_names(self, subject: str | None = None) -> list[str]:
        """Names of the streams that store ``subject`` (every stream when None)."""
        ...

    async def stream_states(self, subject: str) -> dict[str, StreamState]:
        """The counts of every stream that stores ``subject``, by name (a call per 256 streams)."""
        ...

    async def ensure_bucket(self, spec: BucketSpec) -> KeyValue:
        """Create the bucket or bring it to ``spec``."""
        ...

    def kv(self, bucket: str) -> KeyValue:
        """A handle on a bucket (no I/O)."""
        ...

    async def ensure_object_store(self, spec: ObjectStoreSpec) -> ObjectStore:
        """Create the object store or bring it to ``spec``."""
        ...

    def objects(self, bucket: str) -> ObjectStore:
        """A handle on an object store (no I/O)."""
        ...

    def events(self) -> AbstractAsyncContextManager[AsyncIterator[BusEvent]]:
        """Connection events from now on (bounded; the oldest are dropped for a slow reader)."""
        ...

    def statistics(self) -> BusStatistics:
        """Counters."""
        ...

    async def usage(self) -> StoreUsage:
        """JetStream's use of the store by this account (one API call)."""
        ...
