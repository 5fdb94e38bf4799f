"""The worker's serving tasks: jobs run concurrently, tasks are reused and given back after a burst,
and a job handed over as the session ends still runs to its clean-up."""

from __future__ import annotations

import asyncio

import anyio
import pytest

from nvcf_mono.worker.slots import Slots

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the worker runs on asyncio (grpclib)


async def test_jobs_run_at_once_and_waiting_tasks_are_reused() -> None:
    release = anyio.Event()
    running: list[int] = []
    tasks: set[asyncio.Task[object] | None] = set()

    def job(n: int) -> object:
        async def run() -> None:
            tasks.add(asyncio.current_task())
            running.append(n)
            await release.wait()

        return run

    async with anyio.create_task_group() as tg:
        slots = Slots(tg, spare=64)
        for n in range(10):
            slots.hand(job(n))  # type: ignore[arg-type]
        await wait_until(lambda: len(running) == 10)
        assert len(tasks) == 10, "ten jobs at once: ten tasks"
        release.set()
        await wait_until(lambda: slots.waiting == 10)
        tasks.clear()
        for n in range(30):
            slots.hand(job(n))  # type: ignore[arg-type]
            await wait_until(lambda: slots.waiting == 10)
        assert len(tasks) <= 10, "one job at a time runs on the tasks that waited"
        tg.cancel_scope.cancel()


async def test_no_more_than_spare_tasks_wait_after_a_burst() -> None:
    release = anyio.Event()
    done: list[int] = []

    async def job() -> None:
        await release.wait()
        done.append(1)

    async with anyio.create_task_group() as tg:
        slots = Slots(tg, spare=4)
        for _ in range(50):
            slots.hand(job)
        await anyio.sleep(0.05)
        release.set()
        await wait_until(lambda: len(done) == 50)
        await wait_until(lambda: slots.waiting == 4)
        await anyio.sleep(0.05)
        assert slots.waiting == 4
        tg.cancel_scope.cancel()


@pytest.mark.parametrize("to_a_waiting_task", [True, False])
async def test_a_job_handed_over_as_the_session_ends_runs_its_clean_up(to_a_waiting_task: bool) -> None:
    cleaned: list[str] = []

    async def quick() -> None:
        pass

    async def request() -> None:
        try:
            await anyio.sleep(30)
        finally:
            cleaned.append("request")

    async with anyio.create_task_group() as tg:
        slots = Slots(tg, spare=8)
        if to_a_waiting_task:
            slots.hand(quick)
            await wait_until(lambda: slots.waiting == 1)
        slots.hand(request)
        tg.cancel_scope.cancel()  # before the task that takes it has run
    assert cleaned == ["request"]


async def test_a_request_cancelled_by_its_own_scope_leaves_its_task_usable() -> None:
    seen: list[str] = []

    async def cancelled() -> None:
        with anyio.CancelScope() as scope:
            scope.cancel()
            await anyio.sleep(30)
        seen.append("cancelled")

    async def next_one() -> None:
        task = asyncio.current_task()
        assert task is not None and task.cancelling() == 0
        with anyio.fail_after(5):
            await anyio.sleep(0.01)
        seen.append("next")

    async with anyio.create_task_group() as tg:
        slots = Slots(tg, spare=8)
        slots.hand(cancelled)
        await wait_until(lambda: slots.waiting == 1)
        slots.hand(next_one)
        await wait_until(lambda: slots.waiting == 1 and len(seen) == 2)
        tg.cancel_scope.cancel()
    assert seen == ["cancelled", "next"]


async def test_a_failing_job_fails_the_session_as_a_task_would() -> None:
    async def broken() -> None:
        raise RuntimeError("boom")

    with pytest.raises(ExceptionGroup) as caught:
        async with anyio.create_task_group() as tg:
            Slots(tg, spare=8).hand(broken)
            await anyio.sleep(5)
    assert caught.group_contains(RuntimeError, match="boom")


async def wait_until(condition: object, timeout: float = 5) -> None:
    with anyio.fail_after(timeout):
        while not condition():  # type: ignore[operator]
            await anyio.sleep(0.005)
