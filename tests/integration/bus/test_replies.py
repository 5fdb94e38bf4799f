"""Request and reply through one wildcard inbox (``nvcf_mono.bus.replies``), on a real nats-server:
each caller gets its own reply, deadlines and cancellation leave nothing behind, and JetStream's
answers (stored, duplicate, refused, no stream) come back as nats-py's own errors.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio
import nats
import nats.errors
import pytest
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg as NatsMsg
from nats.js import errors as js_errors

from nvcf_mono.bus.api import StreamSpec
from nvcf_mono.bus.replies import Replies
from nvcf_mono.testing.nats_server import NatsServer
from tests.conftest import connect


@asynccontextmanager
async def client(url: str) -> AsyncIterator[NatsClient]:
    nc = await nats.connect(url, connect_timeout=5, max_reconnect_attempts=0)
    try:
        yield nc
    finally:
        await nc.close()


async def test_two_thousand_callers_at_once_each_get_their_own_reply(
    nats_server: NatsServer, unique: Callable[[str], str]
) -> None:
    subject = unique("echo")
    async with client(nats_server.url) as nc:

        async def echo(msg: NatsMsg) -> None:
            await msg.respond(b"re:" + msg.data)

        await nc.subscribe(subject, cb=echo)
        replies = Replies(nc)
        answers: dict[int, bytes] = {}

        async def call(i: int) -> None:
            answers[i] = (await replies.request(subject, str(i).encode(), timeout=10)).data

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                for i in range(2000):
                    tg.start_soon(call, i)
        assert answers == {i: f"re:{i}".encode() for i in range(2000)}
        assert replies.waiting == 0


async def test_a_deadline_or_a_cancelled_caller_leaves_nothing_waiting_and_a_late_reply_is_dropped(
    nats_server: NatsServer, unique: Callable[[str], str]
) -> None:
    subject = unique("slow")
    async with client(nats_server.url) as nc:
        held: list[NatsMsg] = []

        async def hold(msg: NatsMsg) -> None:
            held.append(msg)

        await nc.subscribe(subject, cb=hold)
        replies = Replies(nc)
        with anyio.fail_after(5), pytest.raises(nats.errors.TimeoutError):
            await replies.request(subject, b"a", timeout=0.2)
        assert replies.waiting == 0
        with anyio.move_on_after(0.2):
            await replies.request(subject, b"b", timeout=10)
        assert replies.waiting == 0
        for msg in held:  # the answers come after the callers gave up: nobody is woken, nothing breaks
            await msg.respond(b"late")
        await nc.publish(held[0].reply.rsplit(".", 1)[0] + ".not-a-token", b"stray")
        await nc.flush()
        await anyio.sleep(0.1)

        async def echo(msg: NatsMsg) -> None:
            await msg.respond(msg.data)

        await nc.subscribe(subject + ".ok", cb=echo)
        with anyio.fail_after(5):
            assert (await replies.request(subject + ".ok", b"c", timeout=5)).data == b"c"
        assert replies.waiting == 0


async def test_nobody_serving_is_no_responders(nats_server: NatsServer, unique: Callable[[str], str]) -> None:
    async with client(nats_server.url) as nc:
        with anyio.fail_after(5), pytest.raises(nats.errors.NoRespondersError):
            await Replies(nc).request(unique("nobody"), b"x", timeout=5)


async def test_jetstream_publishes_are_stored_deduplicated_and_refused_as_nats_py_would_say(
    nats_server: NatsServer, unique: Callable[[str], str]
) -> None:
    name = unique("REPLIES")
    async with connect(nats_server.url) as bus, client(nats_server.url) as nc:
        await bus.ensure_stream(StreamSpec(name=name, subjects=(f"{name.lower()}.>",)))
        other = unique("OTHER")
        await bus.ensure_stream(StreamSpec(name=other, subjects=(f"{other.lower()}.>",)))
        replies = Replies(nc)
        once = {"Nats-Msg-Id": "m"}
        with anyio.fail_after(10):
            first = await replies.publish(f"{name.lower()}.a", b"1", stream=name, timeout=5, headers=once)
            again = await replies.publish(f"{name.lower()}.a", b"1", stream=name, timeout=5, headers=once)
            second = await replies.publish(f"{name.lower()}.b", b"2", stream=name, timeout=5)
            assert (first, again, second) == ((1, False), (1, True), (2, False))
            with pytest.raises(js_errors.APIError) as refused:  # the subject is another stream's
                await replies.publish(f"{other.lower()}.a", b"x", stream=name, timeout=5)
            assert refused.value.err_code == 10060, refused.value  # expected stream does not match
            with pytest.raises(js_errors.NoStreamResponseError):
                await replies.publish(unique("nostream") + ".a", b"x", stream=name, timeout=5)
        assert (await bus.stream(name).info()).messages == 2
        assert replies.waiting == 0
