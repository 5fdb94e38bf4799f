"""The hot path's wake-up flag: a set before the wait counts, a deadline ends it, a cancelled wait leaves it usable."""

from __future__ import annotations

import time

import anyio
import pytest

from nvcf_mono.queues import Wakeup

pytestmark = pytest.mark.anyio


async def test_a_wake_up_before_the_wait_is_not_missed() -> None:
    flag = Wakeup()
    flag.set()
    assert await flag.wait(0.01)
    flag.clear()
    started = time.monotonic()
    assert not await flag.wait(0.05), "cleared: the deadline ends the wait"
    assert 0.04 <= time.monotonic() - started < 1


async def test_set_wakes_a_waiting_task_at_once() -> None:
    flag = Wakeup()
    woken: list[bool] = []

    async def waiter() -> None:
        woken.append(await flag.wait(30))

    started = time.monotonic()
    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter)
        await anyio.sleep(0.01)
        flag.set()
    assert woken == [True] and time.monotonic() - started < 5


async def test_a_cancelled_wait_leaves_the_flag_usable() -> None:
    flag = Wakeup()
    with anyio.move_on_after(0.02) as scope:
        await flag.wait()  # no deadline of its own
    assert scope.cancelled_caught
    flag.set()  # nobody waits now: remembered
    assert await flag.wait(0)
    flag.clear()
    assert not await flag.wait(0), "a stale timer or waiter from the cancelled wait does not count"
