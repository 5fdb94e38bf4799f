"""The object store: large round trips, streaming in and out, replace, list, delete."""

from __future__ import annotations

import hashlib
import os
from collections.abc import AsyncIterator, Callable

import anyio
import pytest

from nvcf_mono.bus.api import ObjectStoreSpec
from nvcf_mono.bus.errors import NotFound
from nvcf_mono.testing.nats_server import NatsServer
from tests.conftest import connect

pytestmark = pytest.mark.nats


async def test_a_20_mib_object_round_trips(nats_server: NatsServer, unique: Callable[[str], str]) -> None:
    data = os.urandom(20 * 1024 * 1024)
    async with connect(nats_server.url) as bus:
        store = await bus.ensure_object_store(ObjectStoreSpec(name=unique("obj")))
        with anyio.fail_after(30):
            info = await store.put("payloads/big.bin", data, metadata={"content-type": "application/octet-stream"})
            assert (info.size, info.chunks) == (len(data), 160)
            back = await store.get("payloads/big.bin")
        assert hashlib.sha256(back).digest() == hashlib.sha256(data).digest()
        stored = await store.info("payloads/big.bin")
        assert stored is not None
        assert (stored.size, stored.digest, stored.metadata) == (
            info.size,
            info.digest,
            {"content-type": "application/octet-stream"},
        )


async def test_streaming_in_and_out(nats_server: NatsServer, unique: Callable[[str], str]) -> None:
    pieces = [os.urandom(n) for n in (1, 100_000, 300_001, 7, 131_072)]

    async def source() -> AsyncIterator[bytes]:
        for piece in pieces:
            yield piece

    async with connect(nats_server.url) as bus:
        store = await bus.ensure_object_store(ObjectStoreSpec(name=unique("stream")))
        info = await store.put("s", source(), chunk_size=64 * 1024)
        assert info.size == sum(map(len, pieces))
        chunks = []
        with anyio.fail_after(10):
            async with store.open("s") as reader:
                assert reader.info.size == info.size
                async for chunk in reader:
                    chunks.append(chunk)
        assert all(len(c) <= 64 * 1024 for c in chunks)
        assert b"".join(chunks) == b"".join(pieces)
        empty = await store.put("empty", b"")
        assert (empty.size, await store.get("empty")) == (0, b"")


async def test_replacing_an_object_frees_the_old_chunks(nats_server: NatsServer, unique: Callable[[str], str]) -> None:
    name = unique("repl")
    async with connect(nats_server.url) as bus:
        store = await bus.ensure_object_store(ObjectStoreSpec(name=name))
        for i in range(5):
            await store.put("same", os.urandom(500_000) + bytes([i]))
        state = await bus.stream(f"OBJ_{name}").info()
        assert state.bytes < 2 * 520_000  # one version's chunks plus its meta, not five
        assert (await store.get("same"))[-1] == 4


async def test_list_and_delete(nats_server: NatsServer, unique: Callable[[str], str]) -> None:
    async with connect(nats_server.url) as bus:
        store = await bus.ensure_object_store(ObjectStoreSpec(name=unique("list")))
        assert await store.list() == []
        for name in ("b", "a", "c"):
            await store.put(name, name.encode() * 10)
        assert await store.delete("b") is True
        assert await store.delete("b") is False
        assert [i.name for i in await store.list()] == ["a", "c"]
        assert await store.info("b") is None
        with pytest.raises(NotFound):
            await store.get("b")
        with pytest.raises(NotFound):
            async with store.open("never"):
                pass
