"""A live gRPC call's client stream as its node keeps it: read by offset, replayable until answered, bounded."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import anyio
import anyio.lowlevel
import pytest

from nvcf_mono.bus.api import Msg
from nvcf_mono.contracts import live_input as wire
from nvcf_mono.contracts import subjects
from nvcf_mono.grpc.raw import pack
from nvcf_mono.planes.invocation.live_input import WINDOW, InputTooLarge, LiveInput
from nvcf_mono.testing.nats_server import NatsServer
from tests.conftest import connect


async def test_reads_by_offset_wait_for_what_comes_and_end_with_the_client() -> None:
    live = LiveInput(limit=1 << 20)
    await live.append(pack([b"body"]))
    assert live.take() == pack([b"body"])  # the call's body; offsets count from after it
    assert await live.read(0, hold=0.01) == wire.WAIT
    one, two = pack([b"one"]), pack([b"two"])
    async with anyio.create_task_group() as tg:

        async def later() -> None:
            await anyio.sleep(0.05)
            await live.append(one)

        tg.start_soon(later)
        with anyio.fail_after(5):
            assert await live.read(0) == wire.DATA + one  # it waited for the client
    await live.append(two)
    live.end()
    assert await live.read(len(one)) == wire.END + two
    assert await live.read(len(one + two)) == wire.END
    assert wire.read_answer(await live.read(len(one + two) + 1)) == ("G", b"")  # beyond the stream


async def test_everything_is_kept_for_a_redelivery_until_the_answer_starts() -> None:
    live = LiveInput(limit=1 << 20)
    a, b = pack([b"a" * 10]), pack([b"b" * 10])
    await live.append(a)
    await live.append(b)
    assert await live.read(len(a)) == wire.DATA + b
    assert await live.read(0) == wire.DATA + a + b  # a second attempt reads from the start
    live.answered()
    assert await live.read(len(a + b), hold=0.01) == wire.WAIT
    assert await live.read(0) == wire.GONE  # read and let go: no attempt may start over now


async def test_a_client_ahead_of_the_function_is_held_back_and_a_long_session_stays_small() -> None:
    live = LiveInput(limit=2 * WINDOW)
    live.answered()
    message = pack([b"x" * (64 * 1024 - 5)])
    sent = 0
    with anyio.move_on_after(0.5):
        while True:
            await live.append(message)
            sent += len(message)
    assert sent == WINDOW  # no further: the function has read nothing
    # The function reads: the client may go on, far past the limit, since what was read is let go.
    async with anyio.create_task_group() as tg:

        async def client() -> None:
            for _ in range(200):
                await live.append(message)
            live.end()

        tg.start_soon(client)
        offset = 0
        with anyio.fail_after(10):
            while True:
                kind, data = wire.read_answer(await live.read(offset))
                offset += len(data)
                if kind == "E":
                    break
    assert offset == WINDOW + 200 * len(message) > 2 * WINDOW


async def test_a_call_holds_at_most_its_limit_before_it_is_answered_body_included() -> None:
    live = LiveInput(limit=100)
    await live.append(b"x" * 60)
    live.take()
    with pytest.raises(InputTooLarge, match="limit of 100 bytes"):
        await live.append(b"y" * 50)


async def test_a_closed_call_answers_gone_and_lets_a_held_back_client_go() -> None:
    live = LiveInput(limit=8 * WINDOW)
    big = b"z" * WINDOW
    await live.append(big)
    async with anyio.create_task_group() as tg:
        tg.start_soon(live.append, b"more")  # held back: the window is full
        await anyio.sleep(0.05)
        live.close()
    assert await live.read(0) == wire.GONE


async def test_a_question_nobody_can_answer_reads_as_gone_and_one_answered_passes_through(
    nats_server: NatsServer, unique: Callable[[str], str]
) -> None:
    # A real nats-server: with no node serving the subject (the client's node is gone) the call is over.
    async with connect(nats_server.url) as bus:
        subject = f"{subjects.input_prefix(unique('node'))}.r1.cap"
        assert await wire.fetch(bus, subject, 0) == wire.GONE

        async def answer(msg: Msg) -> bytes:
            assert wire.parse_question(msg.data) == 7
            return wire.answer(wire.END, b"tail")

        async with anyio.create_task_group() as tg:
            await tg.start(partial(bus.serve, subject, answer))
            assert wire.read_answer(await wire.fetch(bus, subject, 7)) == ("E", b"tail")
            tg.cancel_scope.cancel()
    for bad in (b"", b"-1", b"1e3", b"12345678901234", "٣".encode()):
        assert wire.parse_question(bad) is None, bad


async def test_only_the_latest_question_waits() -> None:
    # A flood of questions for one call (a hostile worker holds its capability) keeps one answer open.
    live = LiveInput(limit=1 << 20)
    answers: list[bytes] = []
    async with anyio.create_task_group() as tg:

        async def ask() -> None:
            answers.append(await live.read(0))

        for _ in range(50):
            tg.start_soon(ask)
            await anyio.lowlevel.checkpoint()
        with anyio.fail_after(5):
            while len(answers) < 49:
                await anyio.sleep(0.01)
        assert set(answers) == {wire.WAIT}  # given way at once, not after HOLD_SECONDS
        await live.append(pack([b"now"]))
    assert answers[-1] == wire.DATA + pack([b"now"])
