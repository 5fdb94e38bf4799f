"""Waiting status polls share one subscription per node: woken by the write, never a consumer each."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import anyio

from nvcf_mono.bus.api import BucketSpec
from nvcf_mono.contracts import buckets
from nvcf_mono.models.account import DEFAULT_ACCOUNT
from nvcf_mono.planes.invocation.result_waits import ResultWaits
from nvcf_mono.testing.nats_server import NatsServer
from nvcf_mono.testing.running import platform
from tests.conftest import connect

log = logging.getLogger("tests.waits")


async def test_a_write_wakes_its_waiters_at_once_and_only_them(
    nats_server: NatsServer, unique: Callable[[str], str]
) -> None:
    name = unique("results")
    async with connect(nats_server.url) as bus:
        kv = await bus.ensure_bucket(BucketSpec(name=name))
        waits = ResultWaits(bus, name, log, recheck=60)
        woke: dict[str, float] = {}

        async def waiter(key: str, timeout: float) -> None:
            async def present() -> bool:
                return await kv.get(key) is not None

            if await waits.wait(key, timeout, present):
                woke[key] = time.monotonic()

        async with anyio.create_task_group() as tg:
            await tg.start(waits.run)
            async with anyio.create_task_group() as waiters:
                for i in range(500):
                    waiters.start_soon(waiter, f"r{i}", 10.0)
                waiters.start_soon(waiter, "never", 0.5)
                await anyio.sleep(0.3)
                assert len(waits) == 501
                assert (await bus.stream(f"KV_{name}").info()).consumer_count == 0
                written = time.monotonic()
                for i in range(500):
                    await kv.put(f"r{i}", b"done")
            tg.cancel_scope.cancel()
        assert set(woke) == {f"r{i}" for i in range(500)}  # "never" timed out
        assert max(woke.values()) - written < 5  # woken by the writes, not by the 60 s recheck
        assert len(waits) == 0


async def test_a_result_written_before_the_wait_or_while_unsubscribed_is_found(
    nats_server: NatsServer, unique: Callable[[str], str]
) -> None:
    name = unique("results")
    async with connect(nats_server.url) as bus:
        kv = await bus.ensure_bucket(BucketSpec(name=name))
        await kv.put("early", b"x")

        async def present_of(key: str) -> bool:
            return await kv.get(key) is not None

        # No subscription running at all: the waiter's own rechecks still find the result.
        waits = ResultWaits(bus, name, log, recheck=0.2)
        assert await waits.wait("early", 1.0, lambda: present_of("early"))
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: _put_later(kv, "late", 0.3))
            with anyio.fail_after(5):
                assert await waits.wait("late", 3.0, lambda: present_of("late"))


async def _put_later(kv: object, key: str, delay: float) -> None:
    await anyio.sleep(delay)
    await kv.put(key, b"y")  # type: ignore[attr-defined]


async def test_a_poll_for_a_request_forgotten_meanwhile_answers_404_without_waiting_out_its_window(
    tmp_path: Path,
) -> None:
    """Another poll fetched the result (and forgot the request) after this one found the request known:
    it answers 404 within a recheck, not 202 at the end of its window.
    """
    async with platform(tmp_path) as p:
        records = p.bus.kv(buckets.REQUESTS.name)
        request_id = str(uuid.uuid4())
        record = buckets.RequestRecord(
            request_id=request_id,
            function_id=str(uuid.uuid4()),
            function_version_id=str(uuid.uuid4()),
            nca_id=DEFAULT_ACCOUNT,
            region="us-west-1",
            state="running",
            created_at="2026-12-07T00:00:00Z",
        )
        await records.put(request_id, buckets.REQUEST.encode(record))
        started = time.monotonic()
        async with anyio.create_task_group() as tg:

            async def forget_soon() -> None:
                await anyio.sleep(0.5)
                await records.delete(request_id)

            tg.start_soon(forget_soon)
            reply = await p.key.get(f"/v2/nvcf/pexec/status/{request_id}", headers={"NVCF-POLL-SECONDS": "25"})
        assert reply.status == 404, reply.body
        assert time.monotonic() - started < 15, "the poll waited out its window"
