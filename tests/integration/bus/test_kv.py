"""KV buckets: revisions and compare-and-set, keys, watches, TTLs."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import pytest

from nvcf_mono.bus.api import BucketSpec, Entry, KvOp
from nvcf_mono.bus.errors import ConflictError, NotFound, RequestTimeout
from nvcf_mono.testing.nats_server import NatsServer
from nvcf_mono.testing.platform import wait_for
from tests.conftest import connect


async def _next(entries: AsyncIterator[Entry], n: int = 1, timeout: float = 10) -> list[Entry]:
    with anyio.fail_after(timeout):
        return [await anext(entries) for _ in range(n)]


async def test_get_put_and_revisions(nats_server: NatsServer, unique: Callable[[str], str]) -> None:
    name = unique("kv")
    async with connect(nats_server.url) as bus:
        kv = await bus.ensure_bucket(BucketSpec(name=name, history=5))
        assert kv.bucket == name
        assert await kv.get("fn.a") is None
        first = await kv.put("fn.a", b"1")
        second = await kv.put("fn.a", b"2")
        assert second > first
        entry = await kv.get("fn.a")
        assert entry is not None
        assert (entry.bucket, entry.key, entry.value, entry.revision) == (name, "fn.a", b"2", second)
        assert (entry.operation, entry.deleted) == (KvOp.PUT, False)
        assert entry.created is not None
        assert await kv.get("fn.b") is None
        await kv.put("fn.empty", b"")
        empty = await kv.get("fn.empty")
        assert empty is not None and empty.value == b""  # an empty value is a value, not a delete
        with pytest.raises(ValueError, match="invalid KV key"):
            await kv.put("bad key", b"x")


async def test_ensure_bucket_is_idempotent(nats_server: NatsServer, unique: Callable[[str], str]) -> None:
    specs = [
        BucketSpec(name=unique("idem")),
        BucketSpec(name=unique("idem_ttl"), ttl=2.0, history=3),
        BucketSpec(name=unique("idem_pk"), per_key_ttl=True),
    ]
    async with connect(nats_server.url) as bus, bus.subscribe("$JS.EVENT.ADVISORY.STREAM.UPDATED.>") as sub:
        for spec in specs:
            kv = await bus.ensure_bucket(spec)
            await kv.put("k", b"v")
            await bus.ensure_bucket(spec)
            entry = await bus.kv(spec.name).get("k")
            assert entry is not None and entry.value == b"v"  # the same bucket, not a new one
        updated = []
        with anyio.fail_after(5):
            while True:
                try:
                    updated.append((await sub.next(timeout=0.5)).subject.rsplit(".", 1)[-1])
                except RequestTimeout:
                    break
        assert not [name for name in updated if name in {f"KV_{s.name}" for s in specs}]


async def test_create_update_and_delete_are_compare_and_set(
    nats_server: NatsServer, unique: Callable[[str], str]
) -> None:
    async with connect(nats_server.url) as bus:
        kv = await bus.ensure_bucket(BucketSpec(name=unique("cas")))
        revision = await kv.create("lease", b"node-a")
        with pytest.raises(ConflictError, match="already exists"):
            await kv.create("lease", b"node-b")
        newer = await kv.update("lease", b"node-a2", revision=revision)
        assert newer > revision
        with pytest.raises(ConflictError, match=f"no longer at revision {revision}"):
            await kv.update("lease", b"node-b", revision=revision)  # a stale writer loses
        with pytest.raises(ConflictError):
            await kv.delete("lease", revision=revision)
        entry = await kv.get("lease")
        assert entry is not None and (entry.value, entry.revision) == (b"node-a2", newer)
        with pytest.raises(ConflictError):
            await kv.update("missing", b"x", revision=7)

        await kv.delete("lease", revision=newer)
        assert await kv.get("lease") is None
        again = await kv.create("lease", b"node-b")  # a deleted key can be created again
        assert again > newer
        with pytest.raises(ConflictError, match="already exists"):
            await kv.create("lease", b"node-c")

        await kv.purge("lease")
        assert await kv.get("lease") is None
        assert await kv.create("lease", b"node-c") > again  # and so can a purged one


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

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                for i in range(20):
                    tg.start_soon(writer, i)
        assert sorted(outcomes) == ["lost"] * 19 + ["won"]


@pytest.mark.slow
async def test_keys_with_a_pattern(nats_server: NatsServer, unique: Callable[[str], str]) -> None:
    # A pattern that matched nothing, or whose last match came before other keys, waited out the whole
    # request timeout for a message that never comes: with a long one, that is a hang these deadlines catch.
    async with connect(nats_server.url, request_timeout=30.0) as bus:
        kv = await bus.ensure_bucket(BucketSpec(name=unique("keys")))
        assert await kv.keys() == []
        for key in ("fn.a", "fn.b", "dep.a", "fn.c", "fn.x.deep"):
            await kv.put(key, b"x")
        await kv.delete("fn.c")
        await kv.put("gone", b"x")
        await kv.purge("gone")
        with anyio.fail_after(10):
            assert sorted(await kv.keys()) == ["dep.a", "fn.a", "fn.b", "fn.x.deep"]
            assert sorted(await kv.keys("fn.*")) == ["fn.a", "fn.b"]
            assert sorted(await kv.keys("fn.>")) == ["fn.a", "fn.b", "fn.x.deep"]
            assert sorted(await kv.keys("*.a")) == ["dep.a", "fn.a"]
        with anyio.fail_after(10):
            assert await kv.keys("nothing.*") == []
        with anyio.fail_after(10):
            assert await kv.keys("dep.*") == ["dep.a"]


async def test_watch_gives_live_values_then_changes_in_order(
    nats_server: NatsServer, unique: Callable[[str], str]
) -> None:
    async with connect(nats_server.url) as bus:
        kv = await bus.ensure_bucket(BucketSpec(name=unique("watch")))
        await kv.put("fn.a", b"1")
        await kv.put("fn.gone", b"x")
        await kv.delete("fn.gone")
        await kv.put("fn.purged", b"x")
        await kv.purge("fn.purged")
        await kv.put("other.z", b"ignored")
        with anyio.fail_after(10):
            async with kv.watch("fn.*") as watch:
                assert [(e.key, e.value) for e in watch.initial] == [("fn.a", b"1")]
                b_rev = await kv.put("fn.b", b"2")
                await kv.put("other.y", b"not watched")
                await kv.put("fn.deeper.no", b"not one level")
                await kv.put("fn.a", b"3")
                await kv.delete("fn.b")
                await kv.purge("fn.a")
                seen = await _next(aiter(watch), 4)
        assert [(e.key, e.value, e.operation) for e in seen] == [
            ("fn.b", b"2", KvOp.PUT),
            ("fn.a", b"3", KvOp.PUT),
            ("fn.b", b"", KvOp.DELETE),
            ("fn.a", b"", KvOp.PURGE),
        ]
        assert seen[0].revision == b_rev
        assert [e.revision for e in seen] == sorted(e.revision for e in seen)
        assert [e.deleted for e in seen] == [False, False, True, True]


async def test_watch_of_an_empty_bucket_and_with_history(nats_server: NatsServer, unique: Callable[[str], str]) -> None:
    async with connect(nats_server.url) as bus:
        kv = await bus.ensure_bucket(BucketSpec(name=unique("hist"), history=5))
        with anyio.fail_after(10):
            async with kv.watch() as watch:
                assert watch.initial == ()
                await kv.put("a", b"first")
                (entry,) = await _next(aiter(watch))
                assert (entry.key, entry.value) == ("a", b"first")
        await kv.put("a", b"second")
        with anyio.fail_after(10):
            async with kv.watch("a", include_history=True) as watch:
                assert [(e.value, e.operation) for e in watch.initial] == [(b"first", KvOp.PUT), (b"second", KvOp.PUT)]
        await kv.delete("a")
        with anyio.fail_after(10):
            async with kv.watch("a", include_history=True) as watch:
                # A delete replaces the key's history with its marker.
                assert [(e.value, e.operation) for e in watch.initial] == [(b"", KvOp.DELETE)]


async def test_a_deleted_key_leaves_nothing_once_its_marker_expires(
    nats_server: NatsServer, unique: Callable[[str], str]
) -> None:
    name = unique("gone")
    async with connect(nats_server.url, deleted_key_ttl=1.0) as bus:
        kv = await bus.ensure_bucket(BucketSpec(name=name, history=5))
        for i in range(5):
            await kv.put("a", str(i).encode())
        await kv.put("b", b"stays")
        async with kv.watch() as watch:
            revision = await kv.delete("a")
            (marker,) = await _next(aiter(watch))
            assert (marker.key, marker.operation, marker.revision) == ("a", KvOp.DELETE, revision)
        stream = bus.stream(f"KV_{name}")
        assert (await stream.info()).messages == 2  # b, and a's marker: a's five revisions are gone

        async def only_b_left() -> bool:
            return (await stream.info()).messages == 1

        await wait_for(only_b_left, timeout=15, interval=0.2, what="the delete marker to expire")
        assert await kv.get("a") is None
        assert await kv.create("a", b"again") > revision


async def test_bucket_ttl_expires_values_and_watchers_see_it(
    nats_server: NatsServer, unique: Callable[[str], str]
) -> None:
    async with connect(nats_server.url) as bus:
        kv = await bus.ensure_bucket(BucketSpec(name=unique("ttl"), ttl=1.0))
        with anyio.fail_after(15):
            async with kv.watch() as watch:
                await kv.put("result.r1", b"done")
                live = await kv.get("result.r1")
                assert live is not None and live.value == b"done"
                put, expired = await _next(aiter(watch), 2)
        assert (put.key, put.operation) == ("result.r1", KvOp.PUT)
        assert expired.key == "result.r1" and expired.deleted
        assert await kv.get("result.r1") is None
        assert await kv.keys() == []
        async with kv.watch() as again:
            assert again.initial == ()  # an expired key is not a live value
        await kv.create("result.r1", b"anew")  # and can be created again


async def test_per_key_ttl(nats_server: NatsServer, unique: Callable[[str], str]) -> None:
    async with connect(nats_server.url) as bus:
        kv = await bus.ensure_bucket(BucketSpec(name=unique("kttl"), per_key_ttl=True))
        with anyio.fail_after(15):
            async with kv.watch("idem.*") as watch:
                await kv.create("idem.k1", b"req-1", ttl=1)
                await kv.put("idem.k2", b"req-2", ttl=1)
                await kv.put("idem.forever", b"stays")
                assert {e.key for e in await _next(aiter(watch), 3)} == {"idem.k1", "idem.k2", "idem.forever"}
                with pytest.raises(ConflictError):
                    await kv.create("idem.k1", b"req-1 again")  # still live
                expired = await _next(aiter(watch), 2)
        assert {e.key for e in expired} == {"idem.k1", "idem.k2"}
        assert all(e.deleted for e in expired)
        assert await kv.get("idem.k1") is None
        assert await kv.get("idem.k2") is None
        forever = await kv.get("idem.forever")
        assert forever is not None and forever.value == b"stays"
        assert await kv.keys() == ["idem.forever"]
        await kv.create("idem.k1", b"again")  # an expired key can be created anew
        entry = await kv.get("idem.k1")
        assert entry is not None and entry.value == b"again"


class _EarlyEnd:
    """A nats-py key watcher that says its initial values are done before delivering them, as nats-py
    does when a value is already on its way to the subscription (nats-io/nats.py#842)."""

    def __init__(self, real: Any) -> None:
        self._real = real
        self._sub = real._sub
        self._said = False

    async def updates(self, timeout: float = 5.0) -> Any:
        if not self._said:
            self._said = True
            return None
        return await self._real.updates(timeout)

    async def stop(self) -> None:
        await self._real.stop()


async def test_keys_and_watches_do_not_miss_values_nats_py_reports_late(
    nats_server: NatsServer, unique: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    async with connect(nats_server.url) as bus:
        kv = await bus.ensure_bucket(BucketSpec(name=unique("early")))
        await kv.put("cluster.request", b"x")
        real_watch = kv._watchable.watch  # type: ignore[attr-defined]

        async def early(*args: Any, **kwargs: Any) -> _EarlyEnd:
            return _EarlyEnd(await real_watch(*args, **kwargs))

        monkeypatch.setattr(kv._watchable, "watch", early)  # type: ignore[attr-defined]
        assert await kv.keys("cluster.*") == ["cluster.request"]
        async with kv.watch("cluster.>") as watch:
            assert [e.key for e in watch.initial] == ["cluster.request"]


async def test_a_finished_watch_leaves_no_consumer_behind(
    nats_server: NatsServer, unique: Callable[[str], str]
) -> None:
    name = unique("watched")
    async with connect(nats_server.url) as bus:
        kv = await bus.ensure_bucket(BucketSpec(name=name))
        await kv.put("a", b"1")
        stream = bus.stream(f"KV_{name}")
        for _ in range(20):
            assert await kv.keys() == ["a"]
            async with kv.watch("a") as watch:
                assert len(watch.initial) == 1
        assert (await stream.info()).consumer_count == 0


async def test_a_bucket_nobody_declared_is_named_as_missing_not_read_as_empty(
    nats_server: NatsServer, unique: Callable[[str], str]
) -> None:
    # A plugin that reads a bucket it forgot to declare must hear so, not find every key absent.
    name = unique("undeclared")
    async with connect(nats_server.url) as bus:
        kv = bus.kv(name)
        calls = (
            lambda: kv.get("a"),
            lambda: kv.put("a", b"1"),
            lambda: kv.create("a", b"1"),
            lambda: kv.delete("a"),
            lambda: kv.keys(),
            lambda: kv.last_revision(),
        )
        for call in calls:
            with pytest.raises(NotFound, match=f"there is no KV bucket '{name}'.*declare_bucket"):
                await call()
