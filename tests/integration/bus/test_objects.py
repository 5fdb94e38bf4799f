"""The object store: large round trips, streaming in and out, replace, metadata, list, delete."""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import AsyncIterator, Callable

import anyio
import pytest

from nvcf_mono.bus.api import ObjectStoreSpec
from nvcf_mono.bus.errors import NotFound, ObjectCorrupted, RequestTimeout
from nvcf_mono.testing.nats_server import NatsServer
from tests.conftest import connect

MiB = 1024 * 1024


def _digest(data: bytes) -> str:
    return "SHA-256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode()


async def test_a_20_mib_object_round_trips(nats_server: NatsServer, unique: Callable[[str], str]) -> None:
    data = os.urandom(20 * MiB)
    bucket = unique("obj")
    async with connect(nats_server.url) as bus:
        store = await bus.ensure_object_store(ObjectStoreSpec(name=bucket))
        assert store.bucket == bucket
        with anyio.fail_after(30):
            info = await store.put("payloads/big.bin", data)
            back = await store.get("payloads/big.bin")
        assert back == data
        assert (info.bucket, info.name, info.size, info.chunks) == (bucket, "payloads/big.bin", len(data), 160)
        assert info.digest == _digest(data)
        assert info.nuid and info.mtime is not None
        stored = await store.info("payloads/big.bin")
        assert stored is not None
        assert (stored.size, stored.chunks, stored.digest, stored.nuid) == (
            info.size,
            info.chunks,
            info.digest,
            info.nuid,
        )


async def test_streaming_in_and_out(nats_server: NatsServer, unique: Callable[[str], str]) -> None:
    pieces = [os.urandom(n) for n in (1, 100_000, 300_001, 7, 131_072, 65_535)]
    whole = b"".join(pieces)
    chunk = 64 * 1024

    async def source() -> AsyncIterator[bytes]:
        for piece in pieces:
            yield piece

    async with connect(nats_server.url) as bus:
        store = await bus.ensure_object_store(ObjectStoreSpec(name=unique("stream")))
        with anyio.fail_after(10):
            info = await store.put("s", source(), chunk_size=chunk)
        assert (info.size, info.chunks, info.digest) == (len(whole), -(-len(whole) // chunk), _digest(whole))
        chunks = []
        with anyio.fail_after(10):
            async with store.open("s") as reader:
                assert (reader.info.size, reader.info.digest) == (info.size, info.digest)
                async for piece in reader:
                    chunks.append(piece)
        # Handed out chunk by chunk, as stored: full chunks, then the remainder.
        assert [len(c) for c in chunks] == [chunk] * (len(whole) // chunk) + [len(whole) % chunk]
        assert b"".join(chunks) == whole

        empty = await store.put("empty", b"")
        assert (empty.size, empty.chunks, await store.get("empty")) == (0, 0, b"")
        async with store.open("empty") as reader:
            assert [c async for c in reader] == []


async def test_replacing_an_object_frees_the_old_chunks(nats_server: NatsServer, unique: Callable[[str], str]) -> None:
    name = unique("repl")
    async with connect(nats_server.url) as bus:
        store = await bus.ensure_object_store(ObjectStoreSpec(name=name))
        await store.put("same", os.urandom(500_000))
        one_version = (await bus.stream(f"OBJ_{name}").info()).bytes
        nuids = set()
        for i in range(5):
            nuids.add((await store.put("same", os.urandom(500_000) + bytes([i]))).nuid)
        assert len(nuids) == 5
        state = await bus.stream(f"OBJ_{name}").info()
        assert state.bytes <= one_version + 100  # one version's chunks and meta, not six
        back = await store.get("same")
        assert (len(back), back[-1]) == (500_001, 4)
        assert [i.name for i in await store.list()] == ["same"]


async def test_metadata_and_description_round_trip(nats_server: NatsServer, unique: Callable[[str], str]) -> None:
    async with connect(nats_server.url) as bus:
        store = await bus.ensure_object_store(ObjectStoreSpec(name=unique("meta")))
        metadata = {"content-type": "application/json", "function-id": "fn-1"}
        put = await store.put("doc.json", b'{"a": 1}', metadata=metadata, description="a document")
        assert (put.metadata, put.description) == (metadata, "a document")
        info = await store.info("doc.json")
        assert info is not None
        assert (info.metadata, info.description, info.size) == (metadata, "a document", 8)
        (listed,) = await store.list()
        assert (listed.name, listed.metadata) == ("doc.json", metadata)
        replaced = await store.put("doc.json", b"{}")
        assert replaced.metadata == {}  # a replacement carries its own metadata
        info = await store.info("doc.json")
        assert info is not None and (info.metadata, info.description) == ({}, "")


async def test_list_and_delete(nats_server: NatsServer, unique: Callable[[str], str]) -> None:
    name = unique("list")
    async with connect(nats_server.url) as bus:
        store = await bus.ensure_object_store(ObjectStoreSpec(name=name))
        assert await store.list() == []
        for obj in ("b", "a", "c"):
            await store.put(obj, obj.encode() * 100_000)
        assert [i.name for i in await store.list()] == ["a", "b", "c"]
        assert [i.size for i in await store.list()] == [100_000] * 3
        before = (await bus.stream(f"OBJ_{name}").info()).bytes
        assert await store.delete("b") is True
        assert await store.delete("b") is False
        assert (await bus.stream(f"OBJ_{name}").info()).bytes < before - 90_000  # its chunks went too
        assert [i.name for i in await store.list()] == ["a", "c"]
        assert await store.info("b") is None
        with pytest.raises(NotFound):
            await store.get("b")
        with pytest.raises(NotFound):
            async with store.open("never"):
                pass
        assert await store.delete("never") is False
        await store.put("b", b"back")  # a deleted name can be stored again
        assert await store.get("b") == b"back"
        assert [i.name for i in await store.list()] == ["a", "b", "c"]


async def test_ensure_object_store_is_idempotent(nats_server: NatsServer, unique: Callable[[str], str]) -> None:
    spec = ObjectStoreSpec(name=unique("oidem"))
    async with (
        connect(nats_server.url) as bus,
        bus.subscribe(f"$JS.EVENT.ADVISORY.STREAM.UPDATED.OBJ_{spec.name}") as sub,
    ):
        store = await bus.ensure_object_store(spec)
        await store.put("x", b"kept")
        await bus.ensure_object_store(spec)
        assert await bus.objects(spec.name).get("x") == b"kept"
        with anyio.fail_after(5), pytest.raises(RequestTimeout):
            await sub.next(timeout=0.5)  # no update advisory: the stream was left alone


async def test_a_failed_put_keeps_the_previous_version(nats_server: NatsServer, unique: Callable[[str], str]) -> None:
    name = unique("fail")

    async def broken() -> AsyncIterator[bytes]:
        for _ in range(4):
            yield os.urandom(100_000)
        raise OSError("the upload was cut off")

    async with connect(nats_server.url) as bus:
        store = await bus.ensure_object_store(ObjectStoreSpec(name=name))
        original = os.urandom(300_000)
        await store.put("model.bin", original)
        before = await bus.stream(f"OBJ_{name}").info()
        with anyio.fail_after(10), pytest.raises(OSError, match="cut off"):
            await store.put("model.bin", broken())
        assert await store.get("model.bin") == original
        after = await bus.stream(f"OBJ_{name}").info()
        assert (after.messages, after.bytes) == (before.messages, before.bytes)  # its chunks were removed


async def test_a_corrupted_object_is_detected(nats_server: NatsServer, unique: Callable[[str], str]) -> None:
    name = unique("bad")
    async with connect(nats_server.url) as bus:
        store = await bus.ensure_object_store(ObjectStoreSpec(name=name))
        info = await store.put("x", os.urandom(3 * 1000), chunk_size=1000)
        # Swap the chunks for others of the same sizes behind the store's back.
        raw = bus.stream(f"OBJ_{name}")
        chunk_subject = f"$O.{name}.C.{info.nuid}"
        assert await raw.purge(subject=chunk_subject) == 3
        for _ in range(3):
            await raw.publish(chunk_subject, os.urandom(1000))
        with anyio.fail_after(10), pytest.raises(ObjectCorrupted):
            await store.get("x")
