"""Core NATS through the bus: ordering, queue groups, request/reply and its failures."""

from __future__ import annotations

from collections.abc import Callable

import anyio
import pytest

from nvcf_mono.bus.api import Msg
from nvcf_mono.bus.errors import NoResponders, RemoteError, RequestTimeout
from nvcf_mono.testing.nats_server import NatsServer
from tests.conftest import connect

pytestmark = pytest.mark.nats


async def test_messages_arrive_in_publish_order_with_headers(
    nats_server: NatsServer, unique: Callable[[str], str]
) -> None:
    subject = unique("order")
    async with connect(nats_server.url) as bus, bus.subscribe(f"{subject}.>") as sub:
        for i in range(1000):
            await bus.publish(f"{subject}.n", str(i).encode(), headers={"Seq": str(i)})
        received = []
        with anyio.fail_after(10):
            async for msg in sub:
                received.append(msg)
                if len(received) == 1000:
                    break
    assert [int(m.data) for m in received] == list(range(1000))
    assert received[7].headers["Seq"] == "7"
    assert received[0].subject == f"{subject}.n"


async def test_a_queue_group_delivers_each_message_to_exactly_one_member(
    nats_server: NatsServer, unique: Callable[[str], str]
) -> None:
    subject = unique("work")
    got: dict[str, list[int]] = {"a": [], "b": []}
    async with connect(nats_server.url) as bus:

        async def member(name: str, *, task_status: anyio.abc.TaskStatus[None]) -> None:
            async with bus.subscribe(subject, queue="workers") as sub:
                task_status.started()
                async for msg in sub:
                    got[name].append(int(msg.data))

        async with anyio.create_task_group() as tg:
            await tg.start(member, "a")
            await tg.start(member, "b")
            await bus.flush()
            for i in range(400):
                await bus.publish(subject, str(i).encode())
            with anyio.fail_after(10):
                while len(got["a"]) + len(got["b"]) < 400:
                    await anyio.sleep(0.01)
            tg.cancel_scope.cancel()
    assert sorted(got["a"] + got["b"]) == list(range(400))
    assert got["a"] and got["b"]


async def test_request_reply_through_serve(nats_server: NatsServer, unique: Callable[[str], str]) -> None:
    subject = unique("echo")

    async def handler(msg: Msg) -> bytes:
        if msg.data == b"fail":
            raise ValueError("cannot echo that")
        return msg.data.upper()

    async with connect(nats_server.url) as bus, anyio.create_task_group() as tg:
        await tg.start(bus.serve, subject, handler)
        with anyio.fail_after(10):
            replies = []

            async def ask(i: int) -> None:
                replies.append((await bus.request(subject, f"hi{i}".encode(), timeout=5)).data)

            async with anyio.create_task_group() as askers:
                for i in range(50):
                    askers.start_soon(ask, i)
            assert sorted(replies) == sorted(f"HI{i}".encode() for i in range(50))
            with pytest.raises(RemoteError, match="ValueError: cannot echo that"):
                await bus.request(subject, b"fail", timeout=5)
        tg.cancel_scope.cancel()


async def test_request_without_responders_and_with_a_silent_one(
    nats_server: NatsServer, unique: Callable[[str], str]
) -> None:
    subject = unique("nobody")
    async with connect(nats_server.url) as bus:
        with anyio.fail_after(5), pytest.raises(NoResponders):
            await bus.request(subject, b"?", timeout=2)
        async with bus.subscribe(subject):  # subscribed, never answers
            with anyio.fail_after(5), pytest.raises(RequestTimeout, match=r"within 0\.2s"):
                await bus.request(subject, b"?", timeout=0.2)


async def test_subscription_next_times_out(nats_server: NatsServer, unique: Callable[[str], str]) -> None:
    async with connect(nats_server.url) as bus, bus.subscribe(unique("quiet")) as sub:
        with anyio.fail_after(5), pytest.raises(RequestTimeout):
            await sub.next(timeout=0.1)
