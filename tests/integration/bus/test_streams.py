"""JetStream streams: idempotent ensure, dedupe, limits, purge, direct reads, message TTL."""

from __future__ import annotations

import json
from collections.abc import Callable

import anyio
import pytest

from nvcf_mono.bus.api import Discard, Retention, StreamSpec
from nvcf_mono.bus.errors import NotFound, RequestTimeout, SpecConflict, StreamFull
from nvcf_mono.bus.nats import CoreSubscription, NatsBus
from nvcf_mono.testing.nats_server import NatsServer
from tests.conftest import connect


def _spec(name: str, **kw: object) -> StreamSpec:
    return StreamSpec(name=name, subjects=(f"{name.lower()}.>",), **kw)  # type: ignore[arg-type]


async def _updates(sub: CoreSubscription) -> int:
    """How many stream-updated advisories arrive (each one comes within milliseconds of the change)."""
    count = 0
    while True:
        try:
            await sub.next(timeout=0.5)
        except RequestTimeout:
            return count
        count += 1


async def _config(bus: NatsBus, name: str) -> dict[str, object]:
    reply = await bus.request(f"$JS.API.STREAM.INFO.{name}", b"", timeout=5)
    return json.loads(reply.data)["config"]  # type: ignore[no-any-return]


async def test_ensure_is_idempotent_and_applies_mutable_changes(
    nats_server: NatsServer, unique: Callable[[str], str]
) -> None:
    name = unique("ENS")
    async with connect(nats_server.url) as bus, bus.subscribe(f"$JS.EVENT.ADVISORY.STREAM.UPDATED.{name}") as sub:
        created = await bus.ensure_stream(_spec(name, max_msgs=10))
        assert (created.name, created.messages) == (name, 0)
        await bus.stream(name).publish(f"{name.lower()}.a", b"1")
        with anyio.fail_after(10):
            for _ in range(3):
                again = await bus.ensure_stream(_spec(name, max_msgs=10))
                assert again.messages == 1  # the same stream, not a new one
            assert await _updates(sub) == 0, "an unchanged spec updated the stream"
            changed = await bus.ensure_stream(_spec(name, max_msgs=20))
            assert changed.messages == 1
            assert await _updates(sub) == 1
        assert (await _config(bus, name))["max_msgs"] == 20


async def test_ensure_refuses_immutable_changes(nats_server: NatsServer, unique: Callable[[str], str]) -> None:
    name = unique("IMM")
    async with connect(nats_server.url) as bus:
        await bus.ensure_stream(_spec(name, storage="file"))
        await bus.stream(name).publish(f"{name.lower()}.a", b"1")
        with pytest.raises(SpecConflict, match="retention"):
            await bus.ensure_stream(_spec(name, storage="file", retention=Retention.WORK_QUEUE))
        with pytest.raises(SpecConflict, match="storage"):
            await bus.ensure_stream(_spec(name, storage="memory"))
        config = await _config(bus, name)
        assert (config["retention"], config["storage"]) == ("limits", "file")
        assert (await bus.stream(name).info()).messages == 1  # refused, not recreated


async def test_a_stream_with_a_short_max_age_can_be_ensured(
    nats_server: NatsServer, unique: Callable[[str], str]
) -> None:
    # max_age below the default 2-minute duplicate window: the window shrinks to fit.
    name = unique("AGE")
    async with connect(nats_server.url) as bus:
        await bus.ensure_stream(_spec(name, max_age=30.0))
        await bus.ensure_stream(_spec(name, max_age=30.0))
        config = await _config(bus, name)
        assert (config["max_age"], config["duplicate_window"]) == (30 * 10**9, 30 * 10**9)
        stream = bus.stream(name)
        first = await stream.publish(f"{name.lower()}.a", b"x", msg_id="once")
        assert (await stream.publish(f"{name.lower()}.a", b"x", msg_id="once")).duplicate
        assert first.seq == (await stream.info()).last_seq == 1


async def test_msg_id_deduplicates(nats_server: NatsServer, unique: Callable[[str], str]) -> None:
    name = unique("DUP")
    subject = f"{name.lower()}.r"
    async with connect(nats_server.url) as bus:
        await bus.ensure_stream(_spec(name))
        stream = bus.stream(name)
        first = await stream.publish(subject, b"x", msg_id="req-1")
        second = await stream.publish(subject, b"x", msg_id="req-1")
        third = await stream.publish(subject, b"y", msg_id="req-2")
        assert (first.stream, first.duplicate, second.duplicate, third.duplicate) == (name, False, True, False)
        assert second.seq == first.seq
        assert third.seq == first.seq + 1
        state = await stream.info()
        assert (state.messages, state.first_seq, state.last_seq) == (2, first.seq, third.seq)


async def test_a_full_discard_new_stream_refuses_messages(
    nats_server: NatsServer, unique: Callable[[str], str]
) -> None:
    name = unique("FULL")
    async with connect(nats_server.url) as bus:
        await bus.ensure_stream(_spec(name, max_msgs=2, discard=Discard.NEW))
        stream = bus.stream(name)
        await stream.publish(f"{name.lower()}.a", b"1")
        await stream.publish(f"{name.lower()}.b", b"2")
        with pytest.raises(StreamFull):
            await stream.publish(f"{name.lower()}.a", b"3")
        state = await stream.info()
        assert (state.messages, state.last_seq) == (2, 2)
        last = await stream.get_last(f"{name.lower()}.a")
        assert last is not None and last.data == b"1"  # the old message was kept, the new one refused


async def test_discard_new_per_subject(nats_server: NatsServer, unique: Callable[[str], str]) -> None:
    name = unique("PSUB")
    low = name.lower()
    async with connect(nats_server.url) as bus:
        await bus.ensure_stream(_spec(name, max_msgs_per_subject=1, discard=Discard.NEW, discard_new_per_subject=True))
        stream = bus.stream(name)
        await stream.publish(f"{low}.a", b"1")
        await stream.publish(f"{low}.b", b"1")  # another subject has its own room
        with pytest.raises(StreamFull):
            await stream.publish(f"{low}.a", b"2")
        assert (await stream.info()).messages == 2


async def test_purge_delete_and_get_last(nats_server: NatsServer, unique: Callable[[str], str]) -> None:
    name = unique("PRG")
    low = name.lower()
    async with connect(nats_server.url) as bus:
        await bus.ensure_stream(_spec(name))
        stream = bus.stream(name)
        for i in range(3):
            await stream.publish(f"{low}.keep", str(i).encode(), headers={"N": str(i)})
        victim = await stream.publish(f"{low}.drop", b"d1")
        for i in range(2, 5):
            await stream.publish(f"{low}.drop", f"d{i}".encode())

        last = await stream.get_last(f"{low}.keep")
        assert last is not None
        assert (last.subject, last.seq, last.data, last.headers["N"]) == (f"{low}.keep", 3, b"2", "2")
        assert last.time is not None
        assert await stream.get_last(f"{low}.none") is None

        assert await stream.delete_msg(victim.seq) is True
        assert await stream.delete_msg(victim.seq) is False  # already gone
        assert await stream.delete_msg(10_000) is False  # never existed
        assert (await stream.info()).messages == 6

        assert await stream.purge(subject=f"{low}.drop") == 3
        assert await stream.get_last(f"{low}.drop") is None
        assert (await stream.info()).messages == 3
        assert await stream.purge() == 3
        state = await stream.info()
        assert (state.messages, state.last_seq) == (0, 7)  # sequences are not reused
        assert await stream.purge() == 0
        assert await stream.delete_msg(1) is False  # purged


async def test_per_message_ttl(nats_server: NatsServer, unique: Callable[[str], str]) -> None:
    name = unique("MTTL")
    low = name.lower()
    async with connect(nats_server.url) as bus:
        await bus.ensure_stream(_spec(name, allow_msg_ttl=True))
        stream = bus.stream(name)
        await stream.publish(f"{low}.short", b"gone soon", ttl=1)
        await stream.publish(f"{low}.long", b"stays")
        assert (await stream.info()).messages == 2
        with anyio.fail_after(10):
            while await stream.get_last(f"{low}.short") is not None:
                await anyio.sleep(0.1)  # the server expires it after its TTL
        assert (await stream.info()).messages == 1
        assert await stream.get_last(f"{low}.long") is not None


async def test_missing_streams_are_not_found(nats_server: NatsServer, unique: Callable[[str], str]) -> None:
    async with connect(nats_server.url) as bus:
        missing = bus.stream(unique("NOPE"))
        with pytest.raises(NotFound):
            await missing.info()
        with pytest.raises(NotFound):
            await missing.publish(f"{unique('nobody')}.stores.this", b"x")
        with pytest.raises(NotFound):
            await missing.purge()
        assert await bus.delete_stream(unique("NOPE")) is False
        name = unique("GONE")
        await bus.ensure_stream(_spec(name))
        assert await bus.delete_stream(name) is True
        with pytest.raises(NotFound):
            await bus.stream(name).info()
