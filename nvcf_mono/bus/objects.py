"""Object store in NATS's layout (stream ``OBJ_<bucket>``; chunks and a rolled-up meta message per object).

Written here rather than taken from nats-py so that puts can stream from an async iterator and reads
hand out chunks as they arrive instead of concatenating the whole object in memory.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
from collections.abc import AsyncIterable, AsyncIterator, Mapping
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any, final

import anyio
import nats.errors
import nats.js.errors as js_errors
from nats.js import JetStreamContext, api
from nats.nuid import NUID

from nvcf_mono.bus.api import ObjectInfo, ObjectStoreSpec
from nvcf_mono.bus.errors import NotFound, ObjectCorrupted, RequestTimeout
from nvcf_mono.bus.jetstream import translate
from nvcf_mono.bus.replies import Replies

DEFAULT_CHUNK_SIZE = 128 * 1024
_DIGEST_PREFIX = "SHA-256="
_NATS_ERRORS = (nats.errors.Error, TimeoutError)
_FETCH_BATCH_BYTES = 4 * 1024 * 1024
_nuid = NUID()


_MSG_TTL: str = api.Header.MSG_TTL.value


def object_store_stream_config(spec: ObjectStoreSpec, default_storage: str, default_replicas: int) -> api.StreamConfig:
    """The stream behind an object store bucket."""
    storage = spec.storage or default_storage
    return api.StreamConfig(
        name=f"OBJ_{spec.name}",
        description=spec.description or None,
        subjects=[f"$O.{spec.name}.C.>", f"$O.{spec.name}.M.>"],
        retention=api.RetentionPolicy.LIMITS,  # stated, so an unchanged bucket compares equal
        max_age=spec.ttl or None,
        max_bytes=spec.max_bytes,
        storage=api.StorageType.FILE if storage == "file" else api.StorageType.MEMORY,
        num_replicas=spec.replicas or default_replicas,
        discard=api.DiscardPolicy.NEW,
        allow_rollup_hdrs=True,
        allow_direct=True,
        allow_msg_ttl=True,  # tombstones of deleted objects expire
        duplicate_window=120.0,
    )


def _encode_name(name: str) -> str:
    return base64.urlsafe_b64encode(name.encode()).decode()


def _parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        # Go writes RFC 3339 with nanoseconds; Python keeps microseconds.
        head, dot, frac = text.rstrip("Z").partition(".")
        return datetime.fromisoformat(f"{head}.{frac[:6]}" if dot else head).replace(tzinfo=UTC)
    except ValueError:
        return None


def _info_from_meta(bucket: str, data: bytes) -> tuple[ObjectInfo, bool]:
    doc = json.loads(data)
    info = ObjectInfo(
        bucket=bucket,
        name=doc.get("name", ""),
        size=int(doc.get("size", 0)),
        chunks=int(doc.get("chunks", 0)),
        digest=doc.get("digest", ""),
        nuid=doc.get("nuid", ""),
        mtime=_parse_time(doc.get("mtime")),
        description=doc.get("description") or "",
        metadata=dict(doc.get("metadata") or {}),
    )
    return info, bool(doc.get("deleted"))


@final
class NatsObjectReader:
    """Chunks of one object, checked against its size and digest at the end."""

    def __init__(self, info: ObjectInfo, chunks: AsyncIterator[bytes]) -> None:
        self.info = info
        self._chunks = chunks

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._chunks


@final
class NatsObjectStore:
    """A handle on one object store bucket."""

    def __init__(
        self, js: JetStreamContext, replies: Replies, bucket: str, timeout: float, *, deleted_ttl: float = 300.0
    ) -> None:
        self._js = js
        self._replies = replies
        self.bucket = bucket
        self._stream = f"OBJ_{bucket}"
        self._timeout = timeout
        self._deleted_ttl = f"{max(1, math.ceil(deleted_ttl))}s"

    def _meta_subject(self, name: str) -> str:
        return f"$O.{self.bucket}.M.{_encode_name(name)}"

    def _chunk_subject(self, nuid: str) -> str:
        return f"$O.{self.bucket}.C.{nuid}"

    async def _read_meta(self, name: str) -> tuple[ObjectInfo, bool] | None:
        try:
            msg = await self._js.get_last_msg(self._stream, self._meta_subject(name))
        except js_errors.NotFoundError:
            return None
        except _NATS_ERRORS as err:
            raise translate(err, f"object {self.bucket}/{name}") from err
        return _info_from_meta(self.bucket, msg.data or b"{}")

    async def info(self, name: str) -> ObjectInfo | None:
        """Metadata of a live object."""
        found = await self._read_meta(name)
        if found is None or found[1]:
            return None
        return found[0]

    async def _purge_chunks(self, nuid: str) -> None:
        try:
            await self._js.purge_stream(self._stream, subject=self._chunk_subject(nuid))
        except _NATS_ERRORS as err:
            raise translate(err, f"purge chunks of {self.bucket}") from err

    async def _publish(self, subject: str, data: bytes, headers: dict[str, str] | None = None) -> None:
        try:
            await self._replies.publish(subject, data, stream=self._stream, timeout=self._timeout, headers=headers)
        except _NATS_ERRORS as err:
            raise translate(err, f"write to {self.bucket}") from err

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
        """Store or replace ``name``; a failed put leaves the previous version in place.

        ``ttl``: seconds after which the object is gone (its chunks and its entry), whatever the bucket keeps.
        """
        if not name:
            raise ValueError("an object needs a name")
        size_limit = chunk_size or DEFAULT_CHUNK_SIZE
        previous = await self._read_meta(name)
        nuid = _nuid.next().decode()
        subject = self._chunk_subject(nuid)
        expiry: dict[str, str] | None = {_MSG_TTL: f"{max(1, math.ceil(ttl))}s"} if ttl else None
        digest = hashlib.sha256()
        size = chunks = 0
        try:
            async for chunk in _rechunk(data, size_limit):
                digest.update(chunk)
                size += len(chunk)
                chunks += 1
                await self._publish(subject, chunk, expiry)
            info = ObjectInfo(
                bucket=self.bucket,
                name=name,
                size=size,
                chunks=chunks,
                nuid=nuid,
                digest=_DIGEST_PREFIX + base64.urlsafe_b64encode(digest.digest()).decode(),
                mtime=datetime.now(UTC),
                description=description,
                metadata=dict(metadata or {}),
            )
            await self._publish(
                self._meta_subject(name), _meta_json(info, size_limit), {"Nats-Rollup": "sub", **(expiry or {})}
            )
        except BaseException:
            with anyio.move_on_after(self._timeout, shield=True):
                try:
                    await self._purge_chunks(nuid)
                except Exception:  # the put already failed; that error is the one to report
                    pass
            raise
        if previous is not None and previous[0].nuid and previous[0].nuid != nuid:
            await self._purge_chunks(previous[0].nuid)
        return info

    async def get(self, name: str) -> bytes:
        """The whole object."""
        out = bytearray()
        async with self.open(name) as reader:
            async for chunk in reader:
                out += chunk
        return bytes(out)

    @asynccontextmanager
    async def open(self, name: str) -> AsyncIterator[NatsObjectReader]:
        """Read ``name`` chunk by chunk."""
        info = await self.info(name)
        if info is None:
            raise NotFound(f"object {self.bucket}/{name}: not found")
        if info.chunks == 0:
            yield NatsObjectReader(info, _empty())
            return
        async with self._ephemeral(self._chunk_subject(info.nuid), api.DeliverPolicy.ALL) as psub:
            yield NatsObjectReader(info, self._read_chunks(info, psub))

    async def _read_chunks(self, info: ObjectInfo, psub: JetStreamContext.PullSubscription) -> AsyncIterator[bytes]:
        digest = hashlib.sha256()
        remaining = info.chunks
        size = 0
        batch_limit = max(1, _FETCH_BATCH_BYTES // max(1, info.size // info.chunks))
        while remaining > 0:
            try:
                msgs = await psub.fetch(min(remaining, batch_limit), timeout=self._timeout)
            except (nats.errors.TimeoutError, TimeoutError) as err:
                raise RequestTimeout(f"object {self.bucket}/{info.name}: chunks stopped arriving") from err
            except _NATS_ERRORS as err:
                raise translate(err, f"object {self.bucket}/{info.name}") from err
            for msg in msgs:
                remaining -= 1
                size += len(msg.data)
                digest.update(msg.data)
                yield msg.data
        expected = info.digest.removeprefix(_DIGEST_PREFIX)
        actual = base64.urlsafe_b64encode(digest.digest()).decode()
        if size != info.size or actual.rstrip("=") != expected.rstrip("="):
            raise ObjectCorrupted(f"object {self.bucket}/{info.name}: size or digest does not match")

    @asynccontextmanager
    async def _ephemeral(
        self, subject: str, deliver: api.DeliverPolicy
    ) -> AsyncIterator[JetStreamContext.PullSubscription]:
        name = _nuid.next().decode()
        config = api.ConsumerConfig(
            name=name,
            filter_subject=subject,
            deliver_policy=deliver,
            ack_policy=api.AckPolicy.NONE,
            inactive_threshold=max(30.0, self._timeout * 2),
            mem_storage=True,
            num_replicas=1,
            max_waiting=1,
        )
        try:
            await self._js.add_consumer(self._stream, config=config)
            psub = await self._js.pull_subscribe_bind(name, stream=self._stream)
        except _NATS_ERRORS as err:
            raise translate(err, f"read {self.bucket}") from err
        try:
            yield psub
        finally:
            with anyio.move_on_after(self._timeout, shield=True):
                try:
                    await psub.unsubscribe()
                    await self._js.delete_consumer(self._stream, name)
                except _NATS_ERRORS:
                    pass  # an ephemeral consumer also expires on its own

    async def delete(self, name: str) -> bool:
        """Remove ``name``; False if it was not there."""
        found = await self._read_meta(name)
        if found is None or found[1]:
            return False
        info = found[0]
        tombstone = {
            "name": name,
            "bucket": self.bucket,
            "nuid": info.nuid,
            "size": 0,
            "chunks": 0,
            "digest": "",
            "deleted": True,
            "mtime": _format_time(datetime.now(UTC)),
        }
        # The tombstone tells readers the object is gone, for a while: then nothing of it is left.
        headers = {"Nats-Rollup": "sub", _MSG_TTL: self._deleted_ttl}
        await self._publish(self._meta_subject(name), json.dumps(tombstone).encode(), headers)
        if info.nuid:
            await self._purge_chunks(info.nuid)
        return True

    async def list(self) -> list[ObjectInfo]:
        """Every live object."""
        subject = f"$O.{self.bucket}.M.>"
        try:
            state = await self._js.stream_info(self._stream, subjects_filter=subject)
        except _NATS_ERRORS as err:
            raise translate(err, f"list {self.bucket}") from err
        count = len(state.state.subjects or {})
        out: list[ObjectInfo] = []
        if count == 0:
            return out
        async with self._ephemeral(subject, api.DeliverPolicy.LAST_PER_SUBJECT) as psub:
            seen = 0
            while seen < count:
                try:
                    msgs = await psub.fetch(min(256, count - seen), timeout=self._timeout)
                except (nats.errors.TimeoutError, TimeoutError):
                    break  # an object was deleted meanwhile; what arrived is the answer
                except _NATS_ERRORS as err:
                    raise translate(err, f"list {self.bucket}") from err
                for msg in msgs:
                    seen += 1
                    info, deleted = _info_from_meta(self.bucket, msg.data)
                    if not deleted:
                        out.append(info)
        return sorted(out, key=lambda i: i.name)


def _format_time(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _meta_json(info: ObjectInfo, chunk_size: int) -> bytes:
    doc: dict[str, Any] = {
        "name": info.name,
        "description": info.description or None,
        "metadata": dict(info.metadata) or None,
        "options": {"max_chunk_size": chunk_size},
        "bucket": info.bucket,
        "nuid": info.nuid,
        "size": info.size,
        "mtime": _format_time(info.mtime or datetime.now(UTC)),
        "chunks": info.chunks,
        "digest": info.digest,
    }
    return json.dumps({k: v for k, v in doc.items() if v is not None}).encode()


async def _empty() -> AsyncIterator[bytes]:
    empty: tuple[bytes, ...] = ()
    for chunk in empty:
        yield chunk


async def _rechunk(data: bytes | AsyncIterable[bytes], size: int) -> AsyncIterator[bytes]:
    """Cut ``data`` into chunks of at most ``size`` bytes."""
    if isinstance(data, bytes | bytearray | memoryview):
        view = memoryview(data)
        for start in range(0, len(view), size):
            yield bytes(view[start : start + size])
        return
    pending = bytearray()
    async for piece in data:
        pending += piece
        while len(pending) >= size:
            yield bytes(pending[:size])
            del pending[:size]
    if pending:
        yield bytes(pending)
