"""KV buckets in NATS's own layout (stream ``KV_<bucket>``, subjects ``$KV.<bucket>.<key>``)."""

from __future__ import annotations

import math
import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any, final

import anyio
import nats.errors
import nats.js.errors as js_errors
from nats.js import JetStreamContext, api
from nats.js.kv import KeyValue as NatsKV

from nvcf_mono.backoff import Backoff
from nvcf_mono.bus.api import BucketSpec, Entry, KvOp
from nvcf_mono.bus.errors import BusError, ConflictError, InvalidKey, NotFound, RequestTimeout
from nvcf_mono.bus.jetstream import STREAM_NOT_FOUND, translate
from nvcf_mono.bus.replies import Replies

_KV_OP = "KV-Operation"
_WRONG_LAST_SEQUENCE = (10071, 10164)
_KEY_RX = re.compile(r"[-/_=.a-zA-Z0-9]+")
_PATTERN_RX = re.compile(r"[-/_=.a-zA-Z0-9*>]+")
_NATS_ERRORS = (nats.errors.Error, TimeoutError)
#: Seconds without a subscriber after which the server removes a watch's consumer (a client that
#: went away without deleting it); while the watch runs it always has one.
_WATCH_INACTIVE = 30.0


def check_key(key: str) -> str:
    """Reject keys NATS cannot store (:class:`InvalidKey`, which the API edge answers as a bad request)."""
    if not _KEY_RX.fullmatch(key) or key.startswith(".") or key.endswith(".") or ".." in key:
        raise InvalidKey(key, f"invalid KV key {key!r}: use letters, digits and -/_= joined by '.'")
    return key


async def bucket_stream_config(
    js: JetStreamContext, spec: BucketSpec, default_storage: str, default_replicas: int, *, marker_ttl: float
) -> api.StreamConfig:
    """The stream behind a bucket, as NATS's own clients lay it out.

    ``marker_ttl``: how long the server's marker for an expired key stays, so watchers learn it is gone.
    """
    storage = spec.storage or default_storage
    expiry_markers = None
    if spec.per_key_ttl or spec.ttl > 0:
        try:
            level = (await js.account_info()).api.level or 0
        except _NATS_ERRORS as err:
            raise translate(err, f"bucket {spec.name}") from err
        if level >= 1:  # nats-server 2.11+: expiries leave markers that watchers see
            expiry_markers = marker_ttl
    duplicate_window = 120.0 if spec.ttl == 0 else min(120.0, spec.ttl)
    return api.StreamConfig(
        name=f"KV_{spec.name}",
        description=spec.description or None,
        subjects=[f"$KV.{spec.name}.>"],
        retention=api.RetentionPolicy.LIMITS,  # stated, so an unchanged bucket compares equal
        allow_direct=False,  # reads go to the leader, so a write is visible to the next read
        allow_rollup_hdrs=True,
        allow_msg_ttl=True,
        deny_delete=True,
        discard=api.DiscardPolicy.NEW,
        duplicate_window=duplicate_window,
        max_age=spec.ttl or None,
        max_bytes=spec.max_bytes,
        max_consumers=-1,
        max_msg_size=spec.max_value_size,
        max_msgs=-1,
        max_msgs_per_subject=spec.history,
        num_replicas=spec.replicas or default_replicas,
        storage=api.StorageType.FILE if storage == "file" else api.StorageType.MEMORY,
        subject_delete_marker_ttl=expiry_markers,
    )


def _op(value: str | None) -> KvOp:
    if value == "DEL":
        return KvOp.DELETE
    if value == "PURGE":
        return KvOp.PURGE
    return KvOp.PUT


def _ttl_header(ttl: float) -> str:
    # JetStream TTLs are whole seconds; round up so a value never lives shorter than asked.
    return f"{max(1, math.ceil(ttl))}s"


@final
class NatsWatch:
    """Initial live entries, then changes as they happen."""

    def __init__(self, watcher: NatsKV.KeyWatcher, initial: tuple[Entry, ...], bucket: str, revision: int) -> None:
        self._watcher = watcher
        self.initial = initial
        self._bucket = bucket
        self.revision = revision

    def __aiter__(self) -> NatsWatch:
        return self  # a class iterator survives a cancelled step, unlike an async generator

    async def __anext__(self) -> Entry:
        while True:
            raw = await self._watcher.__anext__()  # type: ignore[no-untyped-call]
            if raw is not None:  # the "caught up" marker was consumed before the watch was handed out
                return _entry(self._bucket, raw)


def _entry(bucket: str, raw: NatsKV.Entry) -> Entry:
    return Entry(
        bucket=bucket,
        key=raw.key,
        value=raw.value or b"",
        revision=raw.revision or 0,
        operation=_op(raw.operation),
        created=raw.created if isinstance(raw.created, datetime) else None,
    )


@final
class NatsKeyValue:
    """A handle on one bucket."""

    def __init__(
        self, js: JetStreamContext, replies: Replies, bucket: str, timeout: float, *, deleted_ttl: float = 900.0
    ) -> None:
        self._js = js
        self._replies = replies
        self._deleted_ttl = _ttl_header(deleted_ttl)
        self.bucket = bucket
        self._stream = f"KV_{bucket}"
        self._prefix = f"$KV.{bucket}."
        self._timeout = timeout
        self._watchable = NatsKV(name=bucket, stream=self._stream, pre=self._prefix, js=js, direct=False)

    async def _publish(self, key: str, value: bytes, headers: dict[str, str]) -> int:
        try:
            seq, _ = await self._replies.publish(
                self._prefix + check_key(key), value, stream=self._stream, timeout=self._timeout, headers=headers
            )
        except js_errors.APIError as err:
            if err.err_code in _WRONG_LAST_SEQUENCE:
                raise ConflictError(f"{self.bucket}/{key}: {err.description}") from err
            raise self._failed(err, f"write {self.bucket}/{key}") from err
        except _NATS_ERRORS as err:
            raise self._failed(err, f"write {self.bucket}/{key}") from err
        return seq

    def _failed(self, err: Exception, what: str) -> BusError:
        """The bus's error for a failed call, naming a bucket that does not exist as such.

        (nats-py answers a read of a missing bucket as it answers a missing key; a plugin that forgot to
        declare its bucket would otherwise see every key absent.)
        """
        error = translate(err, what)
        if isinstance(error, NotFound):
            return NotFound(
                f"{what}: there is no KV bucket {self.bucket!r} "
                "(a plugin declares the buckets it uses in setup(), with ctx.declare_bucket)"
            )
        return error

    async def _last(self, key: str) -> tuple[Entry | None, int]:
        """The newest revision of ``key`` (possibly a delete marker) and its sequence (0 if none)."""
        try:
            msg = await self._js.get_msg(self._stream, subject=self._prefix + check_key(key))
        except js_errors.NotFoundError as err:
            if err.err_code == STREAM_NOT_FOUND:
                raise self._failed(err, f"read {self.bucket}/{key}") from err
            return None, 0
        except _NATS_ERRORS as err:
            raise translate(err, f"read {self.bucket}/{key}") from err
        headers = msg.headers or {}
        op = _op(headers.get(_KV_OP))
        if op is KvOp.PUT and headers.get("Nats-Marker-Reason"):
            op = KvOp.PURGE  # an expiry marker left by the server
        entry = Entry(
            bucket=self.bucket,
            key=key,
            value=msg.data or b"",
            revision=msg.seq or 0,
            operation=op,
            created=msg.time,
        )
        return entry, entry.revision

    async def get(self, key: str) -> Entry | None:
        """The live entry, or None."""
        entry, _ = await self._last(key)
        return None if entry is None or entry.deleted else entry

    async def put(self, key: str, value: bytes, *, ttl: float | None = None) -> int:
        """Write unconditionally."""
        return await self._publish(key, value, {api.Header.MSG_TTL: _ttl_header(ttl)} if ttl else {})

    async def create(self, key: str, value: bytes, *, ttl: float | None = None) -> int:
        """Write only if there is no live value (a deleted key can be created again)."""
        headers = {"Nats-Expected-Last-Subject-Sequence": "0"}
        if ttl:
            headers[api.Header.MSG_TTL] = _ttl_header(ttl)
        try:
            return await self._publish(key, value, headers)
        except ConflictError:
            last, seq = await self._last(key)
            if last is None or not last.deleted:
                raise ConflictError(f"{self.bucket}/{key} already exists") from None
            headers["Nats-Expected-Last-Subject-Sequence"] = str(seq)
            try:
                return await self._publish(key, value, headers)
            except ConflictError:
                raise ConflictError(f"{self.bucket}/{key} already exists") from None

    async def update(self, key: str, value: bytes, *, revision: int, ttl: float | None = None) -> int:
        """Write only if the key is still at ``revision`` (with a new TTL when given)."""
        headers = {"Nats-Expected-Last-Subject-Sequence": str(revision)}
        if ttl:
            headers[api.Header.MSG_TTL] = _ttl_header(ttl)
        try:
            return await self._publish(key, value, headers)
        except ConflictError:
            raise ConflictError(f"{self.bucket}/{key} is no longer at revision {revision}") from None

    async def delete(self, key: str, *, revision: int | None = None) -> int:
        """Leave a delete marker (only at ``revision`` when given); returns its revision.

        The marker replaces the key's older revisions and expires after ``deleted_ttl``: a deleted
        key costs nothing once watchers have had time to see it go.
        """
        headers = {_KV_OP: "DEL", "Nats-Rollup": "sub", api.Header.MSG_TTL: self._deleted_ttl}
        if revision is not None:
            headers["Nats-Expected-Last-Subject-Sequence"] = str(revision)
        try:
            return await self._publish(key, b"", headers)
        except ConflictError:
            raise ConflictError(f"{self.bucket}/{key} is no longer at revision {revision}") from None

    async def purge(self, key: str) -> None:
        """Remove the key and its history."""
        await self._publish(key, b"", {_KV_OP: "PURGE", "Nats-Rollup": "sub", api.Header.MSG_TTL: self._deleted_ttl})

    async def last_revision(self) -> int:
        """The bucket stream's last sequence."""
        try:
            info = await self._js.stream_info(self._stream)
        except _NATS_ERRORS as err:
            raise self._failed(err, f"bucket {self.bucket}") from err
        return int(info.state.last_seq or 0)

    async def keys(self, pattern: str = ">") -> list[str]:
        """Live keys matching ``pattern``."""
        async with self.watch(pattern) as watch:
            return [entry.key for entry in watch.initial]

    async def _catch_up(self, watcher: Any, keep: Callable[[Any], None], received: Callable[[], int]) -> None:
        """Read what the server delivered before nats-py said the initial values were done.

        nats-py can end the initial load early: messages already sent to the subscription but not yet
        through its callback are not counted (nats-io/nats.py#842), so a watch (and ``keys()``) may
        miss keys that exist. The consumer says what it still has to send and how many messages it
        sent: once nothing is left to send, read on until that many have arrived. (Not the last stream
        sequence it names: a filtered consumer moves that past messages it skipped, so a pattern that
        matched nothing in a bucket that is not empty waited for one that never comes, the whole
        deadline.) A straggler that never comes (a marker nats-py drops) ends the wait at the deadline.
        """
        with anyio.move_on_after(self._timeout):
            backoff = Backoff(0.002, 0.05)
            while True:
                try:
                    info = await watcher._sub.consumer_info()
                except _NATS_ERRORS as err:
                    raise translate(err, f"watch {self.bucket}: consumer info") from err
                # Values the server has not sent yet are part of the initial load too; until it has
                # sent them the last sequence it names is not the last one.
                if not info.num_pending:
                    break
                await anyio.sleep(backoff.next())
            delivered = info.delivered.consumer_seq or 0
            while received() < delivered:
                try:
                    raw = await watcher.updates(timeout=self._timeout)
                except nats.errors.TimeoutError:
                    return
                if raw is not None:
                    keep(raw)

    @asynccontextmanager
    async def watch(self, pattern: str = ">", *, include_history: bool = False) -> AsyncIterator[NatsWatch]:
        """Watch keys matching ``pattern``; the initial live values are loaded before this yields."""
        if not _PATTERN_RX.fullmatch(pattern):
            raise InvalidKey(pattern, f"invalid KV key pattern {pattern!r}")
        try:
            watcher = await self._watchable.watch(
                pattern, include_history=include_history, inactive_threshold=_WATCH_INACTIVE
            )
        except _NATS_ERRORS as err:
            raise self._failed(err, f"watch {self.bucket}/{pattern}") from err
        try:
            initial: dict[str, Entry] = {}
            last_seen = 0
            received = 0

            def keep(raw: Any) -> None:
                nonlocal last_seen, received
                received += 1
                entry = _entry(self.bucket, raw)
                last_seen = max(last_seen, entry.revision)
                if entry.deleted and not include_history:
                    initial.pop(entry.key, None)
                else:
                    initial[entry.key if not include_history else f"{entry.key}@{entry.revision}"] = entry

            while True:
                # Each step of the initial load has its own deadline: a big bucket may take a while,
                # a silent server may not.
                try:
                    raw = await watcher.updates(timeout=self._timeout)  # type: ignore[no-untyped-call]
                except nats.errors.TimeoutError as err:
                    raise RequestTimeout(f"watch {self.bucket}/{pattern}: initial values did not arrive") from err
                if raw is None:
                    break
                keep(raw)
            await self._catch_up(watcher, keep, lambda: received)
            yield NatsWatch(watcher, tuple(initial.values()), self.bucket, last_seen)
        finally:
            with anyio.move_on_after(self._timeout, shield=True):
                consumer = getattr(watcher._sub, "_consumer", None)
                try:
                    await watcher.stop()  # type: ignore[no-untyped-call]
                    # The watch's consumer goes with it, not after an inactivity timeout: short watches
                    # (keys(), one-off reads) must not pile up consumers on the bucket's stream.
                    if consumer:
                        await self._js.delete_consumer(self._stream, consumer)
                except _NATS_ERRORS:
                    pass
