"""JetStream streams: idempotent ensure, dedupe, limits, purge and direct reads."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from nvcf_mono.bus.api import Discard, Retention, StreamSpec
from nvcf_mono.bus.errors import NotFound, SpecConflict, StreamFull
from nvcf_mono.testing.nats_server import NatsServer
from tests.conftest import connect

pytestmark = pytest.mark.nats


def _spec(name: str, **kw: object) -> StreamSpec:
    return StreamSpec(name=name, subjects=(f"{name.lower()}.>",), **kw)  # type: ignore[arg-type]


async def test_ensure_is_idempotent_and_applies_mutable_changes(
    nats_server: NatsServer, unique: Callable[[str], str]
) -> None:
    name = unique("ENS")
    async with connect(nats_server.url) as bus:
        await bus.ensure_stream(_spec(name, max_msgs=10))
        await bus.stream(name).publish(f"{name.lower()}.a", b"1")
        again = await bus.ensure_stream(_spec(name, max_msgs=10))
        assert again.messages == 1  # not recreated
        await bus.ensure_stream(_spec(name, max_msgs=20))
        info = await bus.client.jetstream().stream_info(name)
        assert info.config.max_msgs == 20
        with pytest.raises(SpecConflict, match="cannot be changed in place"):
            await bus.ensure_stream(_spec(name, max_msgs=20, retention=Retention.WORK_QUEUE))
        with pytest.raises(SpecConflict, match="storage"):
            await bus.ensure_stream(_spec(name, max_msgs=20, storage="memory"))


async def test_msg_id_deduplicates_within_the_window(nats_server: NatsServer, unique: Callable[[str], str]) -> None:
    name = unique("DUP")
    async with connect(nats_server.url) as bus:
        await bus.ensure_stream(_spec(name))
        stream = bus.stream(name)
        first = await stream.publish(f"{name.lower()}.r", b"x", msg_id="req-1")
        second = await stream.publish(f"{name.lower()}.r", b"x", msg_id="req-1")
        third = await stream.publish(f"{name.lower()}.r", b"y", msg_id="req-2")
        assert (first.duplicate, second.duplicate, third.duplicate) == (False, True, False)
        assert second.seq == first.seq
        assert (await stream.info()).messages == 2


async def test_a_full_discard_new_stream_refuses_messages(
    nats_server: NatsServer, unique: Callable[[str], str]
) -> None:
    name = unique("FULL")
    async with connect(nats_server.url) as bus:
        await bus.ensure_stream(_spec(name, max_msgs=2, discard=Discard.NEW))
        stream = bus.stream(name)
        await stream.publish(f"{name.lower()}.a", b"1")
        await stream.publish(f"{name.lower()}.a", b"2")
        with pytest.raises(StreamFull):
            await stream.publish(f"{name.lower()}.a", b"3")
        assert (await stream.info()).messages == 2


async def test_purge_by_subject_delete_and_get_last(nats_server: NatsServer, unique: Callable[[str], str]) -> None:
    name = unique("PRG")
    low = name.lower()
    async with connect(nats_server.url) as bus:
        await bus.ensure_stream(_spec(name))
        stream = bus.stream(name)
        for i in range(3):
            await stream.publish(f"{low}.keep", str(i).encode(), headers={"N": str(i)})
        victim = await stream.publish(f"{low}.drop", b"d1")
        await stream.publish(f"{low}.drop", b"d2")
        last = await stream.get_last(f"{low}.keep")
        assert last is not None and last.data == b"2" and last.headers["N"] == "2"
        assert await stream.get_last(f"{low}.none") is None
        assert await stream.delete_msg(victim.seq) is True
        assert await stream.delete_msg(victim.seq) is False
        assert await stream.purge(subject=f"{low}.drop") == 1
        assert (await stream.info()).messages == 3
        assert await stream.purge() == 3
        assert (await stream.info()).messages == 0


async def test_missing_streams_are_not_found(nats_server: NatsServer, unique: Callable[[str], str]) -> None:
    async with connect(nats_server.url) as bus:
        with pytest.raises(NotFound):
            await bus.stream(unique("NOPE")).info()
        with pytest.raises(NotFound):
            await bus.stream(unique("NOPE")).publish("nobody.stores.this", b"x")
        assert await bus.delete_stream(unique("NOPE")) is False
