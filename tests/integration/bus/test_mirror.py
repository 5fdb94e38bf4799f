"""KvMirror: a local copy that follows the bucket, and survives the bucket going away and coming back."""

from __future__ import annotations

from collections.abc import Callable

import anyio
import attrs

from nvcf_mono.bus.api import BucketSpec
from nvcf_mono.bus.codec import VersionedCodec
from nvcf_mono.bus.mirror import KvMirror
from nvcf_mono.testing.nats_server import NatsServer
from tests.conftest import connect


@attrs.frozen
class Item:
    n: int


CODEC = VersionedCodec(Item, 1, "item")


async def _until(check: Callable[[], bool], timeout: float = 10) -> None:
    with anyio.fail_after(timeout):
        while not check():
            await anyio.sleep(0.02)


async def test_the_mirror_follows_puts_and_deletes(nats_server: NatsServer, unique: Callable[[str], str]) -> None:
    async with connect(nats_server.url) as bus:
        kv = await bus.ensure_bucket(BucketSpec(name=unique("mirror")))
        await kv.put("a", CODEC.encode(Item(1)))
        mirror = KvMirror(kv, CODEC)
        async with anyio.create_task_group() as tg:
            await tg.start(mirror.run, bus)
            assert mirror.get("a") == Item(1)
            await kv.put("b", CODEC.encode(Item(2)))
            await kv.delete("a")
            await _until(lambda: mirror.get("b") == Item(2) and mirror.get("a") is None)
            await kv.put("bad", b"not json")  # undecodable values are skipped, not fatal
            await kv.put("c", CODEC.encode(Item(3)))
            await _until(lambda: mirror.get("c") == Item(3))
            assert mirror.get("bad") is None
            tg.cancel_scope.cancel()


async def test_the_mirror_survives_its_bucket_being_removed(
    nats_server: NatsServer, unique: Callable[[str], str]
) -> None:
    async with connect(nats_server.url) as bus:
        spec = BucketSpec(name=unique("gone"))
        kv = await bus.ensure_bucket(spec)
        mirror = KvMirror(kv, CODEC)
        async with anyio.create_task_group() as tg:
            await tg.start(mirror.run, bus)
            await bus.delete_stream(f"KV_{spec.name}")  # as a restarted server loses a memory bucket
            await anyio.sleep(0.3)
            kv = await bus.ensure_bucket(spec)
            await kv.put("x", CODEC.encode(Item(7)))
            await _until(lambda: mirror.get("x") == Item(7), timeout=10)
            tg.cancel_scope.cancel()


async def test_groups_follow_puts_and_deletes(nats_server: NatsServer, unique: Callable[[str], str]) -> None:
    """``group`` (a version's placements, a function's versions) answers from the copy as it is now."""
    async with connect(nats_server.url) as bus:
        kv = await bus.ensure_bucket(BucketSpec(name=unique("groups")))
        for key, n in (("v1.a", 1), ("v1.b", 2), ("v2.a", 3), ("v10.a", 4), ("v1", 5)):
            await kv.put(key, CODEC.encode(Item(n)))
        mirror = KvMirror(kv, CODEC)
        async with anyio.create_task_group() as tg:
            await tg.start(mirror.run, bus)
            assert mirror.group("v1") == [Item(1), Item(2)]  # not v10's, nor the bare key 'v1'
            assert mirror.group("v10") == [Item(4)] and mirror.group("v3") == []
            mirror.group("v1").clear()  # a caller's list is its own
            assert len(mirror.group("v1")) == 2
            await kv.delete("v1.a")
            await kv.put("v3.a", CODEC.encode(Item(6)))
            await _until(lambda: mirror.group("v1") == [Item(2)] and mirror.group("v3") == [Item(6)])
            revision = await kv.put("v2.b", CODEC.encode(Item(7)))
            mirror.note("v2.b", Item(7), revision)  # a node's own write counts at once
            assert mirror.group("v2") == [Item(3), Item(7)]
            tg.cancel_scope.cancel()
