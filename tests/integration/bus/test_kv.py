"""KV buckets: revisions and compare-and-set, watches, TTLs."""

from __future__ import annotations

from collections.abc import Callable

import anyio
import pytest

from nvcf_mono.bus.api import BucketSpec, Entry, KvOp
from nvcf_mono.bus.errors import ConflictError
from nvcf_mono.testing.nats_server import NatsServer
from tests.conftest import connect

pytestmark = pytest.mark.nats


async def test_get_put_and_revisions(nats_server: NatsServer, unique: Callable[[str], str]) -> None:
    async with connect(nats_server.url) as bus:
        kv = await bus.ensure_bucket(BucketSpec(name=unique("kv"), history=5))
        assert await kv.get("fn.a") is None
        first = await kv.put("fn.a", b"1")
        second = await kv.put("fn.a", b"2")
        assert second > first
        entry = await kv.get("fn.a")
        assert entry is not None and (entry.value, entry.revision, entry.operation) == (b"2", second, KvOp.PUT)
        with pytest.raises(ValueError, match="invalid KV key"):
            await kv.put("bad key", b"x")


async def test_create_and_update_are_compare_and_set(nats_server: NatsServer, unique: Callable[[str], str]) -> None:
    async with connect(nats_server.url) as bus:
        kv = await bus.ensure_bucket(BucketSpec(name=unique("cas")))
        revision = await kv.create("lease", b"node-a")
        with pytest.raises(ConflictError, match="already exists"):
            await kv.create("lease", b"node-b")
        newer = await kv.update("lease", b"node-a2", revision=revision)
        with pytest.raises(ConflictError, match=f"no longer at revision {revision}"):
            await kv.update("lease", b"node-b", revision=revision)  # a stale writer loses
        with pytest.raises(ConflictError):
            await kv.delete("lease", revision=revision)
        await kv.delete("lease", revision=newer)
        assert await kv.get("lease") is None
        again = await kv.create("lease", b"node-b")  # a deleted key can be created again
        assert again > newer
        await kv.purge("lease")
        assert await kv.get("lease") is None


async def test_racing_updates_let_exactly_one_writer_win(nats_server: NatsServer, unique: Callable[[str], str]) -> None:
    async with connect(nats_server.url) as bus:
        kv = await bus.ensure_bucket(BucketSpec(name=unique("race")))
        revision = await kv.put("counter", b"0")
        outcomes: list[str] = []

        async def writer(i: int) -> None:
            try:
                await kv.update("counter", str(i).encode(), revision=revision)
                outcomes.append("won")
            except ConflictError:
                outcomes.append("lost")

        async with anyio.create_task_group() as tg:
            for i in range(20):
                tg.start_soon(writer, i)
        assert sorted(outcomes) == ["lost"] * 19 + ["won"]


async def test_keys_with_a_pattern(nats_server: NatsServer, unique: Callable[[str], str]) -> None:
    async with connect(nats_server.url) as bus:
        kv = await bus.ensure_bucket(BucketSpec(name=unique("keys")))
        assert await kv.keys() == []
        for key in ("fn.a", "fn.b", "dep.a", "fn.c"):
            await kv.put(key, b"x")
        await kv.delete("fn.c")
        assert sorted(await kv.keys()) == ["dep.a", "fn.a", "fn.b"]
        assert sorted(await kv.keys("fn.*")) == ["fn.a", "fn.b"]


async def test_watch_gives_live_values_then_changes_in_order(
    nats_server: NatsServer, unique: Callable[[str], str]
) -> None:
    async with connect(nats_server.url) as bus:
        kv = await bus.ensure_bucket(BucketSpec(name=unique("watch")))
        await kv.put("fn.a", b"1")
        await kv.put("fn.gone", b"x")
        await kv.delete("fn.gone")
        await kv.put("other.z", b"ignored")
        with anyio.fail_after(10):
            async with kv.watch("fn.*") as watch:
                assert [(e.key, e.value) for e in watch.initial] == [("fn.a", b"1")]
                await kv.put("fn.b", b"2")
                await kv.put("other.y", b"not watched")
                await kv.put("fn.a", b"3")
                await kv.delete("fn.b")
                seen: list[Entry] = []
                async for entry in watch:
                    seen.append(entry)
                    if len(seen) == 3:
                        break
        assert [(e.key, e.value, e.operation) for e in seen] == [
            ("fn.b", b"2", KvOp.PUT),
            ("fn.a", b"3", KvOp.PUT),
            ("fn.b", b"", KvOp.DELETE),
        ]


async def test_bucket_ttl_expires_values_and_watchers_see_it(
    nats_server: NatsServer, unique: Callable[[str], str]
) -> None:
    async with connect(nats_server.url) as bus:
        kv = await bus.ensure_bucket(BucketSpec(name=unique("ttl"), ttl=1.0))
        with anyio.fail_after(15):
            async with kv.watch() as watch:
                await kv.put("result.r1", b"done")
                assert (await kv.get("result.r1")) is not None
                events = []
                async for entry in watch:
                    events.append(entry)
                    if entry.deleted:
                        break
        assert [e.key for e in events] == ["result.r1", "result.r1"]
        assert events[-1].deleted
        assert await kv.get("result.r1") is None


async def test_per_key_ttl(nats_server: NatsServer, unique: Callable[[str], str]) -> None:
    async with connect(nats_server.url) as bus:
        kv = await bus.ensure_bucket(BucketSpec(name=unique("kttl"), per_key_ttl=True))
        await kv.create("idem.k1", b"req-1", ttl=1)
        await kv.put("idem.k2", b"req-2", ttl=1)
        await kv.put("idem.forever", b"stays")
        with anyio.fail_after(15):
            async with kv.watch("idem.*") as watch:
                expired = set()
                async for entry in watch:
                    if entry.deleted:
                        expired.add(entry.key)
                    if expired == {"idem.k1", "idem.k2"}:
                        break
        assert await kv.get("idem.k1") is None
        assert await kv.get("idem.k2") is None
        assert (await kv.get("idem.forever")) is not None
        await kv.create("idem.k1", b"again")  # an expired key can be created anew
