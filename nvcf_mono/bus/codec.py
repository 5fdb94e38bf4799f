"""Versioned JSON for values kept on the bus (KV entries, stream payloads that outlive a release).

Every value is written as ``{"v": <schema version>, "data": {...}}``. Reading a value written by an
older release runs the registered upgrades in order; a value written by a newer release is refused
with a clear error instead of being misread.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any, Generic, TypeVar, final

import attrs

from nvcf_mono import compact_json
from nvcf_mono.bus.api import KeyValue, Watch
from nvcf_mono.bus.errors import BusError
from nvcf_mono.structure import StructureError, structure_json, unstructure

T = TypeVar("T")

Upgrade = Callable[[dict[str, Any]], dict[str, Any]]


class SchemaVersionError(BusError):
    """A stored value cannot be read by this release."""


@final
@attrs.frozen
class VersionedCodec(Generic[T]):
    """Encodes an attrs type at schema ``version``; ``upgrades[n]`` turns version n data into n+1."""

    type: type[T]
    version: int
    name: str
    upgrades: Mapping[int, Upgrade] = attrs.field(factory=dict)

    def encode(self, value: T) -> bytes:
        """Bytes to store."""
        return compact_json.dumps({"v": self.version, "data": unstructure(value)})

    def decode(self, raw: bytes) -> T:
        """The value; raises SchemaVersionError for unreadable or future versions."""
        try:
            doc = compact_json.loads(raw)
        except ValueError as err:
            raise SchemaVersionError(f"{self.name}: stored value is not JSON") from err
        if not isinstance(doc, dict) or not isinstance(doc.get("v"), int) or not isinstance(doc.get("data"), dict):
            raise SchemaVersionError(f"{self.name}: stored value has no schema version envelope")
        version, data = doc["v"], doc["data"]
        if version > self.version:
            raise SchemaVersionError(
                f"{self.name}: stored with schema version {version}, newer than this release reads ({self.version}); "
                "upgrade every node"
            )
        while version < self.version:
            upgrade = self.upgrades.get(version)
            if upgrade is None:
                raise SchemaVersionError(f"{self.name}: no upgrade from schema version {version}")
            data = upgrade(data)
            version += 1
        try:
            # Unknown fields are kept out rather than fatal: a rolling upgrade may have added one.
            return structure_json(self.type, data)
        except StructureError as err:
            raise SchemaVersionError(f"{self.name}: stored value does not match schema {self.version}: {err}") from err


@final
@attrs.frozen
class Versioned(Generic[T]):
    """A decoded KV value with the revision to pass to :meth:`TypedKV.update`."""

    key: str
    value: T
    revision: int


@final
@attrs.frozen
class TypedChange(Generic[T]):
    """A change seen by :meth:`TypedKV.watch`: ``value`` is None for deletes and expiries."""

    key: str
    value: T | None
    revision: int


@final
class TypedWatch(Generic[T]):
    """Decoded initial values, then decoded changes."""

    def __init__(self, initial: tuple[Versioned[T], ...], changes: AsyncIterator[TypedChange[T]]) -> None:
        self.initial = initial
        self._changes = changes

    def __aiter__(self) -> AsyncIterator[TypedChange[T]]:
        return self._changes


@final
class TypedKV(Generic[T]):
    """A KV bucket whose values are one attrs type, stored with a schema version."""

    def __init__(self, kv: KeyValue, codec: VersionedCodec[T]) -> None:
        self.kv = kv
        self.codec = codec

    async def get(self, key: str) -> Versioned[T] | None:
        entry = await self.kv.get(key)
        return None if entry is None else Versioned(key, self.codec.decode(entry.value), entry.revision)

    async def put(self, key: str, value: T, *, ttl: float | None = None) -> int:
        return await self.kv.put(key, self.codec.encode(value), ttl=ttl)

    async def create(self, key: str, value: T, *, ttl: float | None = None) -> int:
        return await self.kv.create(key, self.codec.encode(value), ttl=ttl)

    async def update(self, key: str, value: T, *, revision: int, ttl: float | None = None) -> int:
        return await self.kv.update(key, self.codec.encode(value), revision=revision, ttl=ttl)

    async def delete(self, key: str, *, revision: int | None = None) -> int:
        return await self.kv.delete(key, revision=revision)

    @asynccontextmanager
    async def watch(self, pattern: str = ">") -> AsyncIterator[TypedWatch[T]]:
        """Like :meth:`KeyValue.watch`, decoded."""
        async with self.kv.watch(pattern) as watch:
            initial = tuple(Versioned(e.key, self.codec.decode(e.value), e.revision) for e in watch.initial)
            yield TypedWatch(initial, self._changes(watch))

    async def _changes(self, watch: Watch) -> AsyncIterator[TypedChange[T]]:
        async for entry in watch:
            value = None if entry.deleted else self.codec.decode(entry.value)
            yield TypedChange(entry.key, value, entry.revision)
