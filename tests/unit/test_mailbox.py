"""The hot path's mailbox: order, deadline, backpressure, closing; a cancelled wait loses nothing."""

from __future__ import annotations

import time

import anyio
import pytest

from nvcf_mono.queues import Mailbox

pytestmark = pytest.mark.anyio


async def test_items_come_in_order_and_a_deadline_ends_the_wait() -> None:
    box: Mailbox[int] = Mailbox(4)
    assert await box.put(1) and await box.put(2)
    assert [await box.get(), await box.get(timeout=0)] == [1, 2]
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        await box.get(timeout=0.05)
    assert 0.04 <= time.monotonic() - started < 1
    await box.put(3)
    assert await box.get(timeout=0) == 3, "a stale timer does not end a later wait"


async def test_a_full_mailbox_holds_writers_back_until_read() -> None:
    box: Mailbox[int] = Mailbox(1)
    await box.put(1)
    order: list[str] = []

    async def writer(n: int) -> None:
        await box.put(n)
        order.append(f"put {n}")

    async with anyio.create_task_group() as tg:
        tg.start_soon(writer, 2)
        await anyio.sleep(0.02)
        assert order == [] and len(box) == 1
        assert await box.get() == 1
        assert await box.get(timeout=1) == 2
    assert order == ["put 2"]


async def test_a_writer_that_gave_up_does_not_take_the_room_from_the_next() -> None:
    box: Mailbox[int] = Mailbox(1)
    await box.put(0)
    async with anyio.create_task_group() as tg:
        with anyio.move_on_after(0.02):
            await box.put(1)  # gives up while full
        tg.start_soon(box.put, 2)
        await anyio.sleep(0.01)
        assert await box.get() == 0
        assert await box.get(timeout=1) == 2


async def test_closing_wakes_the_reader_and_refuses_writers() -> None:
    box: Mailbox[int] = Mailbox(1)
    async with anyio.create_task_group() as tg:

        async def reader() -> None:
            with pytest.raises(anyio.ClosedResourceError):
                await box.get()

        tg.start_soon(reader)
        await anyio.sleep(0.01)
        box.close()
    assert not await box.put(1)


async def test_a_cancelled_reader_leaves_the_mailbox_usable() -> None:
    box: Mailbox[int] = Mailbox(2)
    with anyio.move_on_after(0.01):
        await box.get()
    await box.put(5)
    assert await box.get(timeout=1) == 5
