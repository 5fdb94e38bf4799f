"""Core NATS through the bus: ordering, queue groups, request/reply and its failures, slow readers."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import anyio
import pytest
from anyio.abc import TaskStatus

from nvcf_mono.bus.api import BucketSpec, BusEvent, ConnectionState, Msg, StreamSpec
from nvcf_mono.bus.errors import BusUnavailable, NoResponders, RemoteError, RequestTimeout
from nvcf_mono.testing.nats_server import NatsServer
from tests.conftest import connect


async def test_1000_messages_arrive_in_publish_order(nats_server: NatsServer, unique: Callable[[str], str]) -> None:
    subject = unique("order")
    async with connect(nats_server.url) as bus, bus.subscribe(f"{subject}.>") as sub:
        for i in range(1000):
            await bus.publish(f"{subject}.n", str(i).encode(), headers={"Seq": str(i)})
        received: list[Msg] = []
        with anyio.fail_after(10):
            async for msg in sub:
                received.append(msg)
                if len(received) == 1000:
                    break
    assert [int(m.data) for m in received] == list(range(1000))
    assert [m.headers["Seq"] for m in received] == [str(i) for i in range(1000)]
    assert {m.subject for m in received} == {f"{subject}.n"}
    assert sub.dropped == 0


async def test_a_queue_group_delivers_each_message_to_exactly_one_member(
    nats_server: NatsServer, unique: Callable[[str], str]
) -> None:
    subject = unique("work")
    total = 400
    got: dict[str, list[int]] = {"a": [], "b": []}
    all_in = anyio.Event()
    async with connect(nats_server.url) as bus:

        async def member(name: str, *, task_status: TaskStatus[None]) -> None:
            async with bus.subscribe(subject, queue="workers") as sub:
                task_status.started()
                async for msg in sub:
                    got[name].append(int(msg.data))
                    if len(got["a"]) + len(got["b"]) >= total:
                        all_in.set()

        async with anyio.create_task_group() as tg:
            with anyio.fail_after(5):
                await tg.start(member, "a")
                await tg.start(member, "b")
            for i in range(total):
                await bus.publish(subject, str(i).encode())
            with anyio.fail_after(10):
                await all_in.wait()  # set at the 400th arrival: any duplicate means one is missing
            tg.cancel_scope.cancel()
    assert sorted(got["a"] + got["b"]) == list(range(total))  # each message once, none lost
    assert got["a"] and got["b"], "one member of the group got nothing"


async def test_serve_answers_requests_concurrently_and_reports_handler_errors(
    nats_server: NatsServer, unique: Callable[[str], str]
) -> None:
    subject = unique("echo")
    running = 0
    peak = 0

    async def handler(msg: Msg) -> bytes:
        nonlocal running, peak
        if msg.data == b"fail":
            raise ValueError("cannot echo that")
        running += 1
        peak = max(peak, running)
        await anyio.sleep(0.05)  # long enough for concurrent requests to overlap
        running -= 1
        return msg.data.upper()

    async with connect(nats_server.url) as bus, anyio.create_task_group() as tg:
        with anyio.fail_after(5):
            await tg.start(bus.serve, subject, handler)
        replies: list[bytes] = []

        async def ask(i: int) -> None:
            replies.append((await bus.request(subject, f"hi{i}".encode(), timeout=5)).data)

        with anyio.fail_after(10):
            async with anyio.create_task_group() as askers:
                for i in range(40):
                    askers.start_soon(ask, i)
            assert sorted(replies) == sorted(f"HI{i}".encode() for i in range(40))
            assert 1 < peak <= 16  # handlers overlap, bounded by the default concurrency
            with pytest.raises(RemoteError, match="ValueError: cannot echo that"):
                await bus.request(subject, b"fail", timeout=5)
            # The failure did not take the responder down.
            assert (await bus.request(subject, b"still here", timeout=5)).data == b"STILL HERE"
        tg.cancel_scope.cancel()


async def test_serve_bounds_concurrency(nats_server: NatsServer, unique: Callable[[str], str]) -> None:
    subject = unique("bounded")
    running = 0
    peak = 0

    async def handler(msg: Msg) -> bytes:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await anyio.sleep(0.05)
        running -= 1
        return b"ok"

    async with connect(nats_server.url) as bus, anyio.create_task_group() as tg:
        with anyio.fail_after(5):
            await tg.start(partial(bus.serve, subject, handler, concurrency=2))
        with anyio.fail_after(10):
            async with anyio.create_task_group() as askers:
                for _ in range(10):
                    askers.start_soon(bus.request, subject, b"x")
        assert peak == 2
        tg.cancel_scope.cancel()


async def test_request_timeout_and_no_responders(nats_server: NatsServer, unique: Callable[[str], str]) -> None:
    subject = unique("nobody")
    async with connect(nats_server.url) as bus:
        with anyio.fail_after(5), pytest.raises(NoResponders):
            await bus.request(subject, b"?", timeout=2)
        async with bus.subscribe(subject):  # subscribed, never answers
            with anyio.fail_after(5), pytest.raises(RequestTimeout, match=r"within 0\.2s"):
                await bus.request(subject, b"?", timeout=0.2)
        # Leaving the context unsubscribed: nobody listens any more.
        with anyio.fail_after(5), pytest.raises(NoResponders):
            await bus.request(subject, b"?", timeout=2)


async def test_subscription_next_times_out_and_stays_usable(
    nats_server: NatsServer, unique: Callable[[str], str]
) -> None:
    subject = unique("quiet")
    async with connect(nats_server.url) as bus, bus.subscribe(subject) as sub:
        with anyio.fail_after(5), pytest.raises(RequestTimeout):
            await sub.next(timeout=0.1)
        await bus.publish(subject, b"later")
        with anyio.fail_after(5):
            assert (await sub.next(timeout=5)).data == b"later"


async def test_a_slow_subscriber_counts_what_it_lost(nats_server: NatsServer, unique: Callable[[str], str]) -> None:
    subject = unique("slow")
    async with (
        connect(nats_server.url) as bus,
        bus.events() as events,
        bus.subscribe(subject, max_pending=10) as sub,
    ):
        for i in range(50):
            await bus.publish(subject, str(i).encode())
        with anyio.fail_after(5):
            # Each message that did not fit is reported as it is dropped.
            reports = 0
            async for event in events:
                reports += event.kind == "slow_consumer" and event.detail == subject
                if reports == 40:
                    break
            assert sub.dropped == 40  # the queue held 10 of the 50
            kept = [int((await sub.next(timeout=1)).data) for _ in range(10)]
        assert kept == list(range(10))
        assert sub.dropped == 40


async def test_a_slow_event_listener_loses_the_oldest_events(
    nats_server: NatsServer, unique: Callable[[str], str]
) -> None:
    flood, last = unique("flood"), unique("last")
    async with connect(nats_server.url) as bus, bus.events() as slow, bus.events() as watcher:
        # Every message a full subscription drops is a slow_consumer event: more than a listener holds.
        async with bus.subscribe(flood, max_pending=1), bus.subscribe(last, max_pending=1):
            for _ in range(200):
                await bus.publish(flood, b"x")
            for _ in range(2):
                await bus.publish(last, b"x")
            with anyio.fail_after(5):
                async for event in watcher:  # read only to know when the last drop has happened
                    if event.detail == last:
                        break
        received: list[BusEvent] = []
        with anyio.fail_after(5):
            async for event in slow:
                received.append(event)
                if event.detail == last:
                    break
        # The listener that never read kept the newest events, the one that matters most among them.
        assert all(e.kind == "slow_consumer" for e in received)
        assert received[-1].detail == last
        assert len(received) < 200  # its buffer did overflow


async def test_a_closed_bus_says_so(nats_server: NatsServer, unique: Callable[[str], str]) -> None:
    name = unique("CLOSED")
    async with connect(nats_server.url) as bus:
        assert bus.state is ConnectionState.CONNECTED
        await bus.ensure_stream(StreamSpec(name=name, subjects=(f"{name.lower()}.>",)))
        kv = await bus.ensure_bucket(BucketSpec(name=unique("closed")))
    assert bus.statistics().state is ConnectionState.CLOSED
    with anyio.fail_after(10):
        with pytest.raises(BusUnavailable):
            await bus.publish(name.lower(), b"x")
        with pytest.raises(BusUnavailable):
            await bus.request(name.lower(), b"x")
        with pytest.raises(BusUnavailable):
            async with bus.subscribe(name.lower()):
                pass
        with pytest.raises(BusUnavailable):
            await bus.stream(name).publish(f"{name.lower()}.a", b"x")
        with pytest.raises(BusUnavailable):
            await kv.get("k")
