"""Many callers polling for results at once: every poll is answered and NATS's consumers do not grow.

Each waiting status poll used to open a KV watch (an ordered consumer) that outlived the poll, so
under a few waiting polls a second the results stream reached its consumer limit and polls got 500.
"""

from __future__ import annotations

import random
from pathlib import Path

import anyio
import pytest

from nvcf_mono.contracts import buckets
from nvcf_mono.testing.platform import Api
from nvcf_mono.testing.running import deployed, launching_agent, platform
from tests.chaos.tally import Tally, scaled

pytestmark = [pytest.mark.slow, pytest.mark.chaos]

RESULTS_STREAM = f"KV_{buckets.RESULTS.name}"


async def test_200_concurrent_waiters_are_answered_and_consumers_stay_flat(tmp_path: Path) -> None:
    requests, waiters = scaled(400), 200
    tally = Tally("polling")
    async with platform(tmp_path) as p, launching_agent(p, tmp_path / "instances"):
        fid, _ = await deployed(p.admin, concurrency=256)
        results = p.bus.stream(RESULTS_STREAM)
        baseline = (await results.info()).consumer_count
        polls = 0
        most_consumers = baseline
        todo: list[tuple[str, str]] = []  # (request id, token)
        rng = random.Random(7)

        senders = anyio.Semaphore(64)  # callers at once; at a large scale, not every request in one burst

        async def submit(i: int) -> None:
            token = f"m{i}"
            async with senders:
                tally.sent += 1
                reply = await p.key.post(
                    f"/v2/nvcf/pexec/functions/{fid}",
                    {"message": token, "delay": round(rng.uniform(1.5, 6.0), 2)},
                    headers={"NVCF-POLL-SECONDS": "1"},
                )
            assert reply.status == 202, reply.body  # every request outlives its poll window
            tally.accepted.add(token)
            todo.append((reply.headers["NVCF-REQID"], token))

        async with anyio.create_task_group() as tg:
            for i in range(requests):
                tg.start_soon(submit, i)
        assert len(todo) == requests

        slots = anyio.Semaphore(waiters)
        patient = Api(p.key.session, p.key.base, p.key.token, timeout=30)

        async def follow(request_id: str, token: str) -> None:
            nonlocal polls
            async with slots:
                while True:
                    polls += 1
                    reply = await patient.get(f"/v2/nvcf/pexec/status/{request_id}", headers={"NVCF-POLL-SECONDS": "2"})
                    if reply.status == 202:
                        continue
                    if reply.status != 200:
                        tally.failed(reply.status, reply.body.decode(errors="replace"))
                        return
                    tally.answered(token, right=reply.json == {"message": token, "reqid": request_id})
                    return

        async def watch_consumers() -> None:
            nonlocal most_consumers
            while True:
                most_consumers = max(most_consumers, (await results.info()).consumer_count)
                await anyio.sleep(0.2)

        with anyio.fail_after(120 * max(1, requests // 400)):
            async with anyio.create_task_group() as tg:
                tg.start_soon(watch_consumers)
                async with anyio.create_task_group() as followers:
                    for request_id, token in todo:
                        followers.start_soon(follow, request_id, token)
                tg.cancel_scope.cancel()
        after = (await results.info()).consumer_count
        tally.report(polls=polls, waiters=waiters, consumers_baseline=baseline, consumers_max=most_consumers)
        tally.assert_exactly_once()
        assert not tally.errors
        # One subscription per node, no consumer per waiting poll.
        assert most_consumers <= baseline + 2, (baseline, most_consumers)
        assert after <= baseline + 2
