"""The rate limiter's window math and tier logic, on an in-memory KV (the bus is covered by the integration test)."""

from __future__ import annotations

import logging
import random
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio
import attrs
import pytest

from nvcf_mono.auth.principal import Principal
from nvcf_mono.bus.api import Entry
from nvcf_mono.bus.errors import BusUnavailable, ConflictError
from nvcf_mono.contracts import buckets
from nvcf_mono.http.problem import ProblemError
from nvcf_mono.metrics import Metrics
from nvcf_mono.models.function import FunctionStatus, FunctionVersion, RateLimit
from nvcf_mono.planes.invocation.config import InvocationConfig
from nvcf_mono.planes.invocation.ratelimit import (
    Decision,
    FixedNodes,
    RateLimiter,
    Window,
    parse,
    plan_of,
    share,
)

T0 = 1_700_000_000.25  # a quarter into a second, a minute, an hour


class MemoryKV:
    """The part of a KV bucket the limiter uses, with revisions, optional latency and outages."""

    bucket = "memory"

    def __init__(self, *, latency: float = 0.0, jitter: float = 0.0, seed: int = 0) -> None:
        self.data: dict[str, tuple[bytes, int]] = {}
        self.seq = 0
        self.calls = 0
        self.latency = latency
        self.jitter = jitter
        self.down = False
        self.hang = False
        self.ttls: dict[str, float | None] = {}
        self._random = random.Random(seed)

    async def _io(self) -> None:
        self.calls += 1
        if self.hang:
            await anyio.sleep_forever()
        if self.down:
            raise BusUnavailable("the bus is down")
        await anyio.sleep(self.latency + self._random.random() * self.jitter)

    def count(self, key: str) -> int:
        return buckets.RATE_COUNT.decode(self.data[key][0]).count

    async def get(self, key: str) -> Entry | None:
        await self._io()
        found = self.data.get(key)
        return None if found is None else Entry(bucket=self.bucket, key=key, value=found[0], revision=found[1])

    async def create(self, key: str, value: bytes, *, ttl: float | None = None) -> int:
        await self._io()
        if key in self.data:
            raise ConflictError(key)
        return self._write(key, value, ttl)

    async def update(self, key: str, value: bytes, *, revision: int, ttl: float | None = None) -> int:
        await self._io()
        if key not in self.data or self.data[key][1] != revision:
            raise ConflictError(key)
        return self._write(key, value, ttl)

    def _write(self, key: str, value: bytes, ttl: float | None) -> int:
        self.seq += 1
        self.data[key] = (value, self.seq)
        self.ttls[key] = ttl
        return self.seq


def version(rate_limit: RateLimit | None, *, owner: str = "acct-a") -> FunctionVersion:
    return FunctionVersion(
        id="fn-1",
        nca_id=owner,
        version_id="ver-1",
        name="echo",
        status=FunctionStatus.ACTIVE,
        created_at="2024-01-01T00:00:00Z",
        rate_limit=rate_limit,
    )


def caller(account: str = "acct-a", subject: str = "alice") -> Principal:
    return Principal(kind="jwt", subject=subject, account=account, scopes=frozenset({"invoke_function"}))


@attrs.define
class Clock:
    now: float = T0

    def __call__(self) -> float:
        return self.now


def config(**changes: Any) -> InvocationConfig:
    return attrs.evolve(InvocationConfig(), **{"rate_limit_flush": 0.01, "rate_limit_timeout": 2.0, **changes})


@asynccontextmanager
async def limiters(kv: MemoryKV, clock: Clock, *, count: int = 1, **changes: Any) -> AsyncIterator[list[RateLimiter]]:
    """``count`` running limiters (nodes) sharing ``kv``."""
    log = logging.getLogger("tests.ratelimit")
    out = [
        RateLimiter(kv, config(**changes), nodes=FixedNodes(count), metrics=Metrics(), log=log, clock=clock)
        for _ in range(count)
    ]
    async with anyio.create_task_group() as tg:
        for limiter in out:
            await tg.start(limiter.run)
        try:
            yield out
        finally:
            tg.cancel_scope.cancel()


async def outcome(limiter: RateLimiter, principal: Principal, fv: FunctionVersion) -> int:
    try:
        await limiter.admit(principal, fv)
    except ProblemError as err:
        assert err.status == 429
        return 429
    return 200


async def run_all(calls: Sequence[tuple[RateLimiter, Principal, FunctionVersion]]) -> list[int]:
    """Every call at once; their statuses in order."""
    results = [0] * len(calls)

    async def one(i: int) -> None:
        results[i] = await outcome(*calls[i])

    async with anyio.create_task_group() as tg:
        for i in range(len(calls)):
            tg.start_soon(one, i)
    return results


async def settled(kv: MemoryKV, key: str, expected: int) -> None:
    with anyio.fail_after(5):
        while key not in kv.data or kv.count(key) != expected:
            await anyio.sleep(0.005)


# ---- window math -------------------------------------------------------------------------------------


def test_rates_parse_into_windows() -> None:
    rates = parse("3-S, 10-M,100-h,1000-D")
    assert [(r.limit, r.period, r.label, r.unit) for r in rates] == [
        (3, 1.0, "3-S", "second"),
        (10, 60.0, "10-M", "minute"),
        (100, 3600.0, "100-H", "hour"),
        (1000, 86400.0, "1000-D", "day"),
    ]


def test_a_node_spends_its_share_locally_then_asks() -> None:
    rate = parse("10-S")[0]
    tier = plan_of(RateLimit(rate_limit="10-S")).account
    assert tier is not None
    w = Window("k", rate, tier, end=1.0)
    # Two nodes: each spends half its part of the headroom (10 / 2 / 2) without a round trip, then
    # a compare-and-set decides.
    for _ in range(2):
        assert w.decide(2, sync=False) is Decision.ADMIT
        w.local += 1
    assert w.decide(2, sync=False) is Decision.SYNC
    assert w.decide(1, sync=False) is Decision.ADMIT  # alone, the whole headroom is this node's
    assert w.decide(1, sync=True) is Decision.SYNC  # syncCheck always asks
    assert [share(10, n) for n in (1, 2, 3, 5, 6)] == [10, 2, 1, 1, 0]
    w.shared = 6  # the total it learnt; its own two are in it now
    w.local = 0
    assert w.allowance(2) == 1 and w.allowance(1) == 4
    w.shared = 10
    assert w.decide(1, sync=False) is Decision.DENY  # a known-full window refuses without I/O
    assert w.decide(1, sync=True) is Decision.DENY
    # Granting: pending admissions join the total first; waiting requests get what is left...
    assert w.grant(current=4, delta=3, want=5, nodes=1) == (3, 10)
    assert w.grant(current=9, delta=3, want=5, nodes=1) == (0, 12)
    assert w.grant(current=2, delta=-1, want=1, nodes=1) == (1, 2)
    # ...less what the other nodes may hold unwritten (their shares), so a burst on every node
    # at once does not go over; the next round, on a fresher total, grants more.
    assert w.grant(current=0, delta=2, want=10, nodes=2) == (6, 8)
    assert w.grant(current=5, delta=0, want=10, nodes=2) == (4, 9)
    assert w.grant(current=9, delta=0, want=10, nodes=2) == (1, 10)
    assert w.grant(current=9, delta=1, want=10, nodes=2) == (0, 10)
    w.exact = True  # syncCheck: nothing is held unwritten anywhere
    assert w.grant(current=0, delta=0, want=12, nodes=2) == (10, 10)


def test_window_keys_follow_nvcf_and_escape_what_nats_cannot_hold() -> None:
    assert buckets.rate_account_key("acct-a", "ver-1", "10-S") == "acct-a.ver-1.10-S"
    assert buckets.rate_user_key("alice", "acct-a", "ver-1", "10-S") == "user.alice.acct-a.ver-1.10-S"
    escaped = buckets.rate_token("alice@example.com")
    assert escaped.startswith("=") and "." not in escaped and "@" not in escaped
    assert buckets.rate_token("=x") != "=x"  # an escaped token can never equal a plain one
    assert buckets.rate_window_key("acct-a.ver-1.10-S", 42) == "acct-a.ver-1.10-S.42"


# ---- tiers ---------------------------------------------------------------------------------------------


def test_tiers_per_user_then_one_account_tier() -> None:
    rl = RateLimit(
        rate_limit="10-S",
        exempted_nca_ids=("acct-free",),
        per_nca_id_rate={"acct-big": "100-S"},
        per_user_rate="2-S,5-M",
    )
    plan = plan_of(rl)
    rules = [(t.rule, [r.label for r in t.rates]) for t in plan.tiers(caller("acct-a"))]
    assert rules == [("perUserRate", ["2-S", "5-M"]), ("rateLimit", ["10-S"])]
    assert [t.rule for t in plan.tiers(caller("acct-big"))] == ["perUserRate", "perNcaIdRate"]
    assert [t.rule for t in plan.tiers(caller("acct-free"))] == ["perUserRate"]
    assert [t.rule for t in plan.tiers(caller("acct-a", subject=""))] == ["rateLimit"]
    assert plan_of(RateLimit(per_nca_id_rate={"acct-big": "1-S"})).tiers(caller("acct-a")) == []


async def test_a_version_without_rate_limit_costs_nothing() -> None:
    kv, clock = MemoryKV(), Clock()
    async with limiters(kv, clock) as (limiter,):
        for _ in range(100):
            await limiter.admit(caller(), version(None))
        await anyio.sleep(0.05)
    assert kv.calls == 0 and not limiter._windows


async def test_one_node_admits_the_rate_per_window_and_says_when_to_retry() -> None:
    kv, clock = MemoryKV(), Clock()
    fv = version(RateLimit(rate_limit="10-S"))
    async with limiters(kv, clock) as (limiter,):
        statuses = [await outcome(limiter, caller(), fv) for _ in range(15)]
        assert statuses == [200] * 10 + [429] * 5
        with pytest.raises(ProblemError) as refused:
            await limiter.admit(caller(), fv)
        assert refused.value.headers["Retry-After"] == "1"
        assert "10 requests per second" in refused.value.detail and "rateLimit 10-S" in refused.value.detail
        key = f"acct-a.ver-1.10-S.{int(T0)}"
        await settled(kv, key, 10)  # refusals count nowhere
        assert kv.ttls[key] is not None and 1 <= kv.ttls[key] <= 3  # gone soon after its window
        assert limiter.limited.value(function_id="fn-1") == 6
        clock.now += 1.0  # the next window
        assert [await outcome(limiter, caller(), fv) for _ in range(11)] == [200] * 10 + [429]
        assert await outcome(limiter, caller("acct-b"), fv) == 200  # another account's own window


async def test_several_rates_all_apply_and_refusals_consume_none() -> None:
    kv, clock = MemoryKV(), Clock()
    fv = version(RateLimit(rate_limit="3-S,10-M"))
    async with limiters(kv, clock) as (limiter,):
        per_second = []
        for _ in range(5):
            per_second.append([await outcome(limiter, caller(), fv) for _ in range(5)].count(200))
            clock.now += 1.0
        # 3 a second until the minute's 10 are spent; the refused 2 a second did not use them up.
        assert per_second == [3, 3, 3, 1, 0]
        await settled(kv, f"acct-a.ver-1.10-M.{int(T0 // 60)}", 10)


async def test_per_user_and_account_tiers_and_exemptions() -> None:
    kv, clock = MemoryKV(), Clock()
    fv = version(
        RateLimit(
            rate_limit="3-S",
            per_user_rate="2-S",
            exempted_nca_ids=("acct-free",),
            per_nca_id_rate={"acct-big": "5-S"},
        )
    )
    async with limiters(kv, clock) as (limiter,):
        alice, bob = caller(subject="alice"), caller(subject="bob")
        assert [await outcome(limiter, alice, fv) for _ in range(3)] == [200, 200, 429]  # her own 2
        assert [await outcome(limiter, bob, fv) for _ in range(2)] == [200, 429]  # the account's 3 are gone
        # Bob's refusal by the account tier took back his charge in the user tier.
        await settled(kv, f"user.bob.acct-a.ver-1.2-S.{int(T0)}", 1)
        # Exempted accounts skip the global rate; per-user still applies.
        assert [await outcome(limiter, caller("acct-free", f"u{i}"), fv) for i in range(8)] == [200] * 8
        assert [await outcome(limiter, caller("acct-free", "carol"), fv) for _ in range(3)] == [200, 200, 429]
        # A per-account rate replaces the global one.
        assert [await outcome(limiter, caller("acct-big", f"u{i}"), fv) for i in range(6)] == [200] * 5 + [429]
        # Without a subject only the account tier applies.
        assert [await outcome(limiter, caller("acct-c", ""), fv) for _ in range(4)] == [200] * 3 + [429]
        with pytest.raises(ProblemError) as refused:
            await limiter.admit(caller("acct-big", "u0"), fv)
        assert "for account 'acct-big'" in refused.value.detail


async def test_rate_limit_changes_take_effect_at_once() -> None:
    kv, clock = MemoryKV(), Clock()
    async with limiters(kv, clock) as (limiter,):
        assert [await outcome(limiter, caller(), version(RateLimit(rate_limit="2-S"))) for _ in range(3)] == [
            200,
            200,
            429,
        ]
        assert await outcome(limiter, caller(), version(RateLimit(rate_limit="5-S"))) == 200


# ---- several nodes -------------------------------------------------------------------------------------


async def test_sync_check_is_exact_across_nodes() -> None:
    kv, clock = MemoryKV(latency=0.002, jitter=0.003), Clock()
    fv = version(RateLimit(rate_limit="10-S", sync_check=True))
    async with limiters(kv, clock, count=3) as nodes:
        statuses = await run_all([(nodes[i % 3], caller(subject=f"u{i}"), fv) for i in range(40)])
        assert statuses.count(200) == 10
        assert statuses.count(429) == 30
        assert sum(n.fail_open.value() for n in nodes) == 0


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.slow
async def test_shared_counts_stay_within_the_documented_bound(seed: int) -> None:
    rng = random.Random(seed)
    n, limit = rng.choice([2, 3, 4, 6]), rng.choice([4, 10, 25, 100])
    latency, jitter = rng.choice([(0.001, 0.004), (0.0, 0.03)])  # a quick bus, and a slow one
    kv, clock = MemoryKV(latency=latency, jitter=jitter, seed=seed), Clock()
    fv = version(RateLimit(rate_limit=f"{limit}-S"))
    async with limiters(kv, clock, count=n, rate_limit_flush=0.05) as nodes:
        calls = [(nodes[rng.randrange(n)], caller(subject=f"u{i}"), fv) for i in range(3 * limit)]
        statuses: list[int] = []

        async def wave(part: Sequence[tuple[RateLimiter, Principal, FunctionVersion]]) -> None:
            statuses.extend(await run_all(part))

        # Bursts with pauses of random length in between: some flushes land, some do not.
        async with anyio.create_task_group() as tg:
            for start in range(0, len(calls), 5):
                tg.start_soon(wave, calls[start : start + 5])
                await anyio.sleep(rng.random() * 0.02)
        admitted = statuses.count(200)
        assert limit <= admitted <= limit + n * share(limit, n)  # the module's documented worst case
        await settled(kv, f"acct-a.ver-1.{limit}-S.{int(T0)}", admitted)


async def test_a_burst_on_two_nodes_admits_about_the_rate() -> None:
    kv, clock = MemoryKV(latency=0.001), Clock()
    fv = version(RateLimit(rate_limit="10-S"))
    async with limiters(kv, clock, count=2) as (a, b):
        statuses = await run_all([((a, b)[i % 2], caller(subject=f"u{i}"), fv) for i in range(30)])
        # Each node spends its 2 locally and writes them at once; the slack is what the other had
        # not yet written when a node's compare-and-set granted more.
        assert 10 <= statuses.count(200) <= 12, statuses


async def test_fail_open_when_the_counter_does_not_answer_in_time() -> None:
    kv, clock = MemoryKV(), Clock()
    fv = version(RateLimit(rate_limit="2-S", sync_check=True))
    async with limiters(kv, clock, rate_limit_timeout=0.05) as (limiter,):
        kv.hang = True
        with anyio.fail_after(2):
            # Let through, and counted here: alone, a node still holds the window to its limit.
            assert [await outcome(limiter, caller(), fv) for _ in range(3)] == [200, 200, 429]
        assert limiter.fail_open.value() == 2
        kv.hang = False
        kv.down = True
        clock.now += 1.0
        assert await outcome(limiter, caller(), fv) == 200  # an error is no answer either
        assert limiter.fail_open.value() == 3
        kv.down = False
        clock.now += 1.0
        assert [await outcome(limiter, caller(), fv) for _ in range(3)] == [200, 200, 429]
        await settled(kv, f"acct-a.ver-1.2-S.{int(T0) + 2}", 2)
