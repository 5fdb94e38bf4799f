"""Durable pull consumers: order, settlement, redelivery, bounded in-flight, backlog, their specs."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable

import anyio
import anyio.lowlevel
import pytest

from nvcf_mono.bus.api import ConsumerSpec, ConsumerState, DeliverPolicy, Delivery, Retention, StreamSpec
from nvcf_mono.bus.errors import NotFound, SpecConflict
from nvcf_mono.bus.nats import NatsBus
from nvcf_mono.testing.nats_server import NatsServer
from nvcf_mono.testing.platform import wait_for
from tests.conftest import connect


async def _work_queue(bus: NatsBus, name: str, *, ack_wait: float = 30.0, **kw: object) -> None:
    await bus.ensure_stream(StreamSpec(name=name, subjects=(f"{name.lower()}.>",), retention=Retention.WORK_QUEUE))
    await bus.stream(name).ensure_consumer(ConsumerSpec(durable="workers", ack_wait=ack_wait, **kw))  # type: ignore[arg-type]


async def _publish(bus: NatsBus, name: str, n: int) -> None:
    for i in range(n):
        await bus.stream(name).publish(f"{name.lower()}.{i}", str(i).encode())


async def _take(deliveries: AsyncIterator[Delivery], n: int, timeout: float = 10) -> list[Delivery]:
    with anyio.fail_after(timeout):
        return [await anext(deliveries) for _ in range(n)]


async def _nothing_within(deliveries: AsyncIterator[Delivery], seconds: float) -> bool:
    with anyio.move_on_after(seconds) as scope:
        await anext(deliveries)
    return scope.cancelled_caught


async def test_deliveries_come_in_order_and_ack_removes_them(
    nats_server: NatsServer, unique: Callable[[str], str]
) -> None:
    name = unique("ORD")
    async with connect(nats_server.url) as bus:
        await _work_queue(bus, name)
        await _publish(bus, name, 50)
        stream = bus.stream(name)
        async with stream.consume("workers", batch=8, max_inflight=64, fetch_timeout=1) as consumer:
            deliveries = await _take(aiter(consumer), 50)
            assert [int(d.data) for d in deliveries] == list(range(50))
            assert [d.stream_seq for d in deliveries] == list(range(1, 51))
            assert [d.consumer_seq for d in deliveries] == list(range(1, 51))
            assert {d.num_delivered for d in deliveries} == {1}
            assert deliveries[0].subject == f"{name.lower()}.0"
            assert deliveries[0].num_pending == 49 and deliveries[-1].num_pending == 0
            stored = deliveries[0].timestamp
            assert stored is not None and abs(stored.timestamp() - time.time()) < 60
            for d in deliveries[:30]:
                await d.ack_sync()
            assert (await stream.info()).messages == 20  # a work queue forgets acked messages
            for d in deliveries[30:]:
                await d.ack_sync()
            assert consumer.statistics().in_flight == 0
            assert consumer.statistics().delivered == 50
        assert (await stream.info()).messages == 0


async def test_nak_redelivers_and_counts_attempts(nats_server: NatsServer, unique: Callable[[str], str]) -> None:
    name = unique("NAK")
    async with connect(nats_server.url) as bus:
        await _work_queue(bus, name)
        await _publish(bus, name, 1)
        async with bus.stream(name).consume("workers", fetch_timeout=1) as consumer:
            deliveries = aiter(consumer)
            (first,) = await _take(deliveries, 1)
            assert first.num_delivered == 1
            await first.nak()
            (second,) = await _take(deliveries, 1)
            assert (second.data, second.stream_seq, second.num_delivered) == (first.data, first.stream_seq, 2)
            started = time.monotonic()
            await second.nak(delay=1.0)
            (third,) = await _take(deliveries, 1)
            assert time.monotonic() - started >= 0.9, "a delayed nak was redelivered early"
            assert third.num_delivered == 3
            await third.ack_sync()
            state = await bus.stream(name).consumer_info("workers")
            assert (state.num_pending, state.num_ack_pending, state.num_redelivered) == (0, 0, 0)
        assert (await bus.stream(name).info()).messages == 0


async def test_unsettled_work_is_redelivered_after_ack_wait(
    nats_server: NatsServer, unique: Callable[[str], str]
) -> None:
    name = unique("AW")
    async with connect(nats_server.url) as bus:
        await _work_queue(bus, name, ack_wait=1.0)
        await _publish(bus, name, 1)
        stream = bus.stream(name)
        async with stream.consume("workers", max_inflight=4, fetch_timeout=0.5) as consumer:
            deliveries = aiter(consumer)
            (first,) = await _take(deliveries, 1)
            started = time.monotonic()
            # Never settled, as by a worker that hangs: the server hands the message out again.
            (again,) = await _take(deliveries, 1)
            assert time.monotonic() - started >= 0.9
            assert (again.data, again.stream_seq, again.num_delivered) == (first.data, first.stream_seq, 2)
            assert (await stream.consumer_info("workers")).num_redelivered == 1
            await again.ack_sync()
        assert (await stream.info()).messages == 0


async def test_in_progress_holds_a_delivery_past_ack_wait(
    nats_server: NatsServer, unique: Callable[[str], str]
) -> None:
    name = unique("WIP")
    async with connect(nats_server.url) as bus:
        await _work_queue(bus, name, ack_wait=1.0)
        await _publish(bus, name, 1)
        stream = bus.stream(name)
        async with stream.consume("workers", max_inflight=4, fetch_timeout=0.5) as consumer:
            deliveries = aiter(consumer)
            (delivery,) = await _take(deliveries, 1)

            async def keep_alive() -> None:
                while True:
                    await anyio.sleep(0.4)
                    await delivery.in_progress()

            async with anyio.create_task_group() as tg:
                tg.start_soon(keep_alive)
                # 2.5 s of work, well past the 1 s ack wait: no redelivery meanwhile.
                assert await _nothing_within(deliveries, 2.5)
                tg.cancel_scope.cancel()
            state = await stream.consumer_info("workers")
            assert (state.num_redelivered, state.num_ack_pending) == (0, 1)
            await delivery.ack_sync()
        assert (await stream.info()).messages == 0


async def test_term_stops_redelivery(nats_server: NatsServer, unique: Callable[[str], str]) -> None:
    name = unique("TERM")
    async with connect(nats_server.url) as bus:
        await _work_queue(bus, name, ack_wait=1.0)
        await _publish(bus, name, 2)
        stream = bus.stream(name)
        async with stream.consume("workers", max_inflight=4, fetch_timeout=0.5) as consumer:
            deliveries = aiter(consumer)
            poison, good = await _take(deliveries, 2)
            await poison.term()
            await good.nak()
            (retried,) = await _take(deliveries, 1)
            assert retried.data == good.data  # nak'd comes back, the terminated one does not
            await retried.ack_sync()
            assert await _nothing_within(deliveries, 1.5)  # past the ack wait
            state = await stream.consumer_info("workers")
            assert (state.num_pending, state.num_ack_pending, state.num_redelivered) == (0, 0, 0)
            assert consumer.statistics().in_flight == 0


async def test_max_deliver_gives_up(nats_server: NatsServer, unique: Callable[[str], str]) -> None:
    name = unique("MAXD")
    async with connect(nats_server.url) as bus:
        await _work_queue(bus, name, max_deliver=2)
        await _publish(bus, name, 1)
        async with bus.stream(name).consume("workers", fetch_timeout=0.5) as consumer:
            deliveries = aiter(consumer)
            for attempt in (1, 2):
                (delivery,) = await _take(deliveries, 1)
                assert delivery.num_delivered == attempt
                await delivery.nak()
            assert await _nothing_within(deliveries, 1.0)


async def test_max_inflight_bounds_unsettled_deliveries(nats_server: NatsServer, unique: Callable[[str], str]) -> None:
    name = unique("BND")
    async with connect(nats_server.url) as bus:
        await _work_queue(bus, name)
        await _publish(bus, name, 10)
        async with bus.stream(name).consume("workers", batch=10, max_inflight=3, fetch_timeout=0.5) as consumer:
            deliveries = aiter(consumer)
            held = await _take(deliveries, 3)
            assert consumer.statistics().in_flight == 3
            fourth: list[Delivery] = []
            got_fourth = anyio.Event()

            async def take_one() -> None:
                fourth.extend(await _take(deliveries, 1))
                got_fourth.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(take_one)
                with anyio.move_on_after(1.0):
                    await got_fourth.wait()
                assert not fourth, "a fourth delivery was handed out while three were unsettled"
                await held[0].ack()  # frees one slot
                with anyio.fail_after(5):
                    await got_fourth.wait()
            assert int(fourth[0].data) == 3
            assert consumer.statistics().in_flight == 3
            server = await bus.stream(name).consumer_info("workers")
            assert server.num_ack_pending <= 3


async def test_max_inflight_holds_after_cancelled_steps(nats_server: NatsServer, unique: Callable[[str], str]) -> None:
    # A step cancelled while it waits for messages leaves its pull request on the server;
    # what that request brings later must not push the consumer past its bound.
    name = unique("CNL")
    async with connect(nats_server.url) as bus:
        await _work_queue(bus, name)
        async with bus.stream(name).consume("workers", batch=3, max_inflight=3, fetch_timeout=3) as consumer:
            deliveries = aiter(consumer)
            for _ in range(3):
                assert await _nothing_within(deliveries, 0.2)  # nothing published yet
            await _publish(bus, name, 20)
            held = await _take(deliveries, 3)
            assert [int(d.data) for d in held] == [0, 1, 2]  # the consumer is still usable, in order
            assert consumer.statistics().in_flight == 3
            assert await _nothing_within(deliveries, 0.5)
            await held[0].ack()
            (next_one,) = await _take(deliveries, 1)
            assert int(next_one.data) == 3
            assert consumer.statistics().in_flight == 3


async def test_consumer_info_reports_the_backlog(nats_server: NatsServer, unique: Callable[[str], str]) -> None:
    name = unique("BKL")
    async with connect(nats_server.url) as bus:
        await _work_queue(bus, name)
        await _publish(bus, name, 5)
        stream = bus.stream(name)

        async def counted() -> ConsumerState | None:
            # nats-server counts a consumer's pending messages apart from storing them: a moment later.
            info = await stream.consumer_info("workers")
            return info if info.num_pending == 5 else None

        before = await wait_for(counted, timeout=5, what="the consumer to count the 5 stored messages")
        assert (before.name, before.num_pending, before.num_ack_pending) == ("workers", 5, 0)
        async with stream.consume("workers", batch=2, max_inflight=2, fetch_timeout=0.5) as consumer:
            first, second = await _take(aiter(consumer), 2)
            during = await stream.consumer_info("workers")
            assert (during.num_pending, during.num_ack_pending, during.delivered_stream_seq) == (3, 2, 2)
            await second.ack_sync()
            after = await stream.consumer_info("workers")
            assert (after.num_pending, after.num_ack_pending, after.ack_floor_stream_seq) == (3, 1, 0)
            await first.ack_sync()
            assert (await stream.consumer_info("workers")).ack_floor_stream_seq == 2


async def test_filters_pick_subjects(nats_server: NatsServer, unique: Callable[[str], str]) -> None:
    name = unique("FLT")
    low = name.lower()
    async with connect(nats_server.url) as bus:
        await bus.ensure_stream(StreamSpec(name=name, subjects=(f"{low}.>",)))
        stream = bus.stream(name)
        await stream.ensure_consumer(ConsumerSpec(durable="ab", filter_subjects=(f"{low}.a", f"{low}.b")))
        await stream.ensure_consumer(ConsumerSpec(durable="c", filter_subjects=(f"{low}.c",)))
        for subject in ("a", "c", "b", "d", "a"):
            await stream.publish(f"{low}.{subject}", subject.encode())
        async with stream.consume("ab", fetch_timeout=0.5) as ab, stream.consume("c", fetch_timeout=0.5) as c:
            assert [d.data for d in await _take(aiter(ab), 3)] == [b"a", b"b", b"a"]
            assert [d.data for d in await _take(aiter(c), 1)] == [b"c"]
        assert (await stream.consumer_info("ab")).num_pending == 0


async def test_ensure_consumer_updates_and_conflicts(nats_server: NatsServer, unique: Callable[[str], str]) -> None:
    name = unique("CSP")
    async with connect(nats_server.url) as bus:
        await bus.ensure_stream(StreamSpec(name=name, subjects=(f"{name.lower()}.>",)))
        stream = bus.stream(name)
        await stream.publish(f"{name.lower()}.a", b"1")
        state = await stream.ensure_consumer(ConsumerSpec(durable="w", ack_wait=30))
        assert (state.name, state.num_pending) == ("w", 1)
        again = await stream.ensure_consumer(ConsumerSpec(durable="w", ack_wait=30))
        assert again.num_pending == 1  # the same consumer, its position kept
        await stream.ensure_consumer(ConsumerSpec(durable="w", ack_wait=10))
        info = await bus.client.jetstream().consumer_info(name, "w")
        assert info.config.ack_wait == 10
        with pytest.raises(SpecConflict):
            await stream.ensure_consumer(ConsumerSpec(durable="w", deliver_policy=DeliverPolicy.NEW))
        assert (await stream.info()).consumer_count == 1
        assert await stream.delete_consumer("w") is True
        assert await stream.delete_consumer("w") is False
        with pytest.raises(NotFound):
            await stream.consumer_info("w")
        with pytest.raises(NotFound):
            async with stream.consume("w"):
                pass
        with pytest.raises(NotFound):
            await bus.stream(unique("NOS")).ensure_consumer(ConsumerSpec(durable="w"))


async def _count_pulls(
    bus: NatsBus, name: str, seconds: float, work: Callable[[], Awaitable[None]] | None = None
) -> int:
    """Pull requests sent for ``name``'s durable while ``work`` runs (and ``seconds`` after)."""
    count = 0
    async with bus.subscribe(f"$JS.API.CONSUMER.MSG.NEXT.{name}.workers") as sub, anyio.create_task_group() as tg:

        async def counting() -> None:
            nonlocal count
            async for _ in sub:
                count += 1

        tg.start_soon(counting)
        if work is not None:
            await work()
        await anyio.sleep(seconds)
        tg.cancel_scope.cancel()
    return count


async def test_a_lingering_pull_serves_many_deliveries(nats_server: NatsServer, unique: Callable[[str], str]) -> None:
    name = unique("LNG")
    async with connect(nats_server.url) as bus, connect(nats_server.url) as watcher:
        await _work_queue(bus, name)
        async with bus.stream(name).consume("workers", batch=16, max_inflight=16, fetch_timeout=5.0) as consumer:
            deliveries = aiter(consumer)

            async def one_at_a_time() -> None:
                for i in range(40):
                    await bus.stream(name).publish(f"{name.lower()}.{i}", str(i).encode())
                    (delivery,) = await _take(deliveries, 1)
                    assert int(delivery.data) == i
                    await delivery.ack()

            pulls = await _count_pulls(watcher, name, 0.2, one_at_a_time)
    # One pull request per fetch would be 40 or more (80 with a no-wait probe each); asking again only
    # when half the slots are free is about one per 8 deliveries here.
    assert 1 <= pulls <= 8, pulls


async def test_a_refused_pull_is_asked_again_after_a_pause(
    nats_server: NatsServer, unique: Callable[[str], str]
) -> None:
    name = unique("RFS")
    async with connect(nats_server.url) as bus, connect(nats_server.url) as watcher:
        await _work_queue(bus, name, max_waiting=1)
        stream = bus.stream(name)
        async with (
            stream.consume("workers", batch=1, max_inflight=1, fetch_timeout=5.0) as first,
            stream.consume("workers", batch=1, max_inflight=1, fetch_timeout=5.0) as second,
            anyio.create_task_group() as tg,
        ):
            for consumer in (first, second):
                tg.start_soon(anext, aiter(consumer))  # both waiting; the server keeps one pull (max_waiting 1)
            pulls = await _count_pulls(watcher, name, 2.0)
            tg.cancel_scope.cancel()
    # The refused one asks again every REFUSED_PAUSE (0.25 s), not in a tight loop.
    assert pulls <= 12, pulls


async def test_a_consumer_deleted_under_a_waiting_pull_is_not_found(
    nats_server: NatsServer, unique: Callable[[str], str]
) -> None:
    name = unique("DEL")
    async with connect(nats_server.url) as bus:
        await _work_queue(bus, name)
        async with bus.stream(name).consume("workers", batch=4, max_inflight=4, fetch_timeout=30.0) as consumer:
            deliveries = aiter(consumer)
            assert await _nothing_within(deliveries, 0.3)  # its pull request is waiting on the server
            assert await bus.stream(name).delete_consumer("workers")
            with anyio.fail_after(5), pytest.raises(NotFound, match="workers"):
                await anext(deliveries)


async def test_closing_a_consumer_strands_nothing_the_server_sent_it(
    nats_server: NatsServer, unique: Callable[[str], str]
) -> None:
    """A stopped consumer gives back everything the server sent it as it closed, for redelivery now. The
    server sends a waiting pull request's messages whether or not anyone still listens, so some were
    lost between the unsubscribe and the server hearing of it, and waited out ack_wait: a worker leaving
    a stopping node under steady load left calls waiting 30 s."""
    name = unique("CLOSE")
    async with connect(nats_server.url) as bus, connect(nats_server.url) as publisher:
        await _work_queue(bus, name, ack_wait=30)
        stream = bus.stream(name)
        rounds = 5
        for _ in range(rounds):
            async with (
                anyio.create_task_group() as tg,
                # Its pull requests ask for more than arrives: they are still open as it closes.
                stream.consume("workers", batch=64, max_inflight=64, fetch_timeout=0.5) as consumer,
            ):
                await _publish(publisher, name, 1)
                (first,) = await _take(aiter(consumer), 1)
                await first.ack_sync()  # its pull requests stay open for more
                tg.start_soon(_publish, publisher, name, 8)  # arriving while the consumer closes
                await anyio.lowlevel.checkpoint()
                consumer.stop()
        left = (await stream.info()).messages
        assert left == rounds * 8  # each round's burst, none acked
        async with stream.consume("workers", batch=64, max_inflight=rounds * 8, fetch_timeout=1) as consumer:
            taken = await _take(aiter(consumer), left, timeout=5)  # not after ack_wait (30 s)
        assert len(taken) == left
