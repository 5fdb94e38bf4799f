"""Durable pull consumers: order, settlement, redelivery, bounded in-flight, backlog."""

from __future__ import annotations

import time
from collections.abc import Callable

import anyio
import pytest

from nvcf_mono.bus.api import ConsumerSpec, Delivery, Retention, StreamSpec
from nvcf_mono.bus.nats import NatsBus
from nvcf_mono.testing.nats_server import NatsServer
from tests.conftest import connect

pytestmark = pytest.mark.nats


async def _queue(bus: NatsBus, name: str, *, ack_wait: float = 30.0, **kw: object) -> None:
    await bus.ensure_stream(StreamSpec(name=name, subjects=(f"{name.lower()}.>",), retention=Retention.WORK_QUEUE))
    await bus.stream(name).ensure_consumer(ConsumerSpec(durable="workers", ack_wait=ack_wait, **kw))  # type: ignore[arg-type]


async def _publish(bus: NatsBus, name: str, n: int) -> None:
    for i in range(n):
        await bus.stream(name).publish(f"{name.lower()}.{i}", str(i).encode())


async def _take(consumer_iter: object, n: int, timeout: float = 10) -> list[Delivery]:
    out = []
    with anyio.fail_after(timeout):
        async for delivery in consumer_iter:  # type: ignore[attr-defined]
            out.append(delivery)
            if len(out) == n:
                break
    return out


async def test_deliveries_come_in_order_and_ack_removes_them(
    nats_server: NatsServer, unique: Callable[[str], str]
) -> None:
    name = unique("ORD")
    async with connect(nats_server.url) as bus:
        await _queue(bus, name)
        await _publish(bus, name, 50)
        async with bus.stream(name).consume("workers", batch=8, max_inflight=64, fetch_timeout=1) as consumer:
            deliveries = await _take(consumer, 50)
            assert [int(d.data) for d in deliveries] == list(range(50))
            assert deliveries[0].num_delivered == 1
            for d in deliveries:
                await d.ack_sync()
        assert (await bus.stream(name).info()).messages == 0


async def test_nak_redelivers_and_counts_attempts(nats_server: NatsServer, unique: Callable[[str], str]) -> None:
    name = unique("NAK")
    async with connect(nats_server.url) as bus:
        await _queue(bus, name)
        await _publish(bus, name, 1)
        async with bus.stream(name).consume("workers", fetch_timeout=1) as consumer:
            (first,) = await _take(consumer, 1)
            await first.nak()
            (second,) = await _take(consumer, 1)
            assert (second.data, second.num_delivered) == (first.data, 2)
            started = time.monotonic()
            await second.nak(delay=0.5)
            (third,) = await _take(consumer, 1)
            assert time.monotonic() - started >= 0.4
            assert third.num_delivered == 3
            await third.ack()


async def test_unacked_work_is_redelivered_after_ack_wait(
    nats_server: NatsServer, unique: Callable[[str], str]
) -> None:
    name = unique("AW")
    async with connect(nats_server.url) as bus:
        await _queue(bus, name, ack_wait=1.0)
        await _publish(bus, name, 1)
        async with bus.stream(name).consume("workers", fetch_timeout=0.5) as consumer:
            (first,) = await _take(consumer, 1)
            started = time.monotonic()
            # A worker that dies without settling: its slot is gone from this consumer,
            # so read the redelivery through a second binding, as another worker would.
            async with bus.stream(name).consume("workers", fetch_timeout=0.5) as other:
                (again,) = await _take(other, 1)
            assert again.num_delivered == 2 and again.data == first.data
            assert time.monotonic() - started >= 0.8
            await again.ack()


async def test_in_progress_holds_a_delivery_past_ack_wait(
    nats_server: NatsServer, unique: Callable[[str], str]
) -> None:
    name = unique("WIP")
    async with connect(nats_server.url) as bus:
        await _queue(bus, name, ack_wait=1.0)
        await _publish(bus, name, 1)
        stream = bus.stream(name)
        async with stream.consume("workers", fetch_timeout=0.5) as consumer:
            (delivery,) = await _take(consumer, 1)
            for _ in range(5):  # 2.5 s of work, well past the 1 s ack wait
                await anyio.sleep(0.5)
                await delivery.in_progress()
            state = await stream.consumer_info("workers")
            assert state.num_redelivered == 0
            assert state.num_ack_pending == 1
            await delivery.ack_sync()
        assert (await stream.info()).messages == 0


async def test_term_stops_redelivery(nats_server: NatsServer, unique: Callable[[str], str]) -> None:
    name = unique("TERM")
    async with connect(nats_server.url) as bus:
        await _queue(bus, name, ack_wait=1.0)
        await _publish(bus, name, 1)
        stream = bus.stream(name)
        async with stream.consume("workers", fetch_timeout=0.5) as consumer:
            (delivery,) = await _take(consumer, 1)
            await delivery.term()
            await anyio.sleep(1.5)
            state = await stream.consumer_info("workers")
            assert (state.num_pending, state.num_ack_pending, state.num_redelivered) == (0, 0, 0)


async def test_max_inflight_bounds_unsettled_deliveries(nats_server: NatsServer, unique: Callable[[str], str]) -> None:
    name = unique("BND")
    async with connect(nats_server.url) as bus:
        await _queue(bus, name)
        await _publish(bus, name, 10)
        async with bus.stream(name).consume("workers", batch=10, max_inflight=3, fetch_timeout=0.5) as consumer:
            iterator = aiter(consumer)
            held = [await anext(iterator) for _ in range(3)]
            assert consumer.statistics().in_flight == 3
            with anyio.move_on_after(1.0) as blocked:
                await anext(iterator)
            assert blocked.cancelled_caught, "a fourth delivery was handed out while three were unsettled"
            await held[0].ack()
            with anyio.fail_after(5):
                fourth = await anext(iterator)
            assert int(fourth.data) == 3
            assert consumer.statistics().in_flight == 3


async def test_consumer_info_reports_the_backlog(nats_server: NatsServer, unique: Callable[[str], str]) -> None:
    name = unique("BKL")
    async with connect(nats_server.url) as bus:
        await _queue(bus, name)
        await _publish(bus, name, 5)
        stream = bus.stream(name)
        before = await stream.consumer_info("workers")
        assert (before.num_pending, before.num_ack_pending) == (5, 0)
        async with stream.consume("workers", batch=2, max_inflight=2, fetch_timeout=0.5) as consumer:
            await _take(consumer, 2)
            during = await stream.consumer_info("workers")
            assert (during.num_pending, during.num_ack_pending) == (3, 2)
