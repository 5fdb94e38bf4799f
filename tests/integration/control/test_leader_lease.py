"""The reconciler's leader lease when the store answers late: a write that landed though its answer
was lost must not cost the only control plane its leadership (it used to read as "taken over",
and the node waited out the lease's TTL leaderless), and another holder's lease is still never taken.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import anyio

from nvcf_mono.bus.api import BucketSpec
from nvcf_mono.bus.codec import TypedKV
from nvcf_mono.bus.errors import RequestTimeout
from nvcf_mono.contracts.buckets import LEASE, Lease
from nvcf_mono.models.common import now_iso
from nvcf_mono.planes.control.leader import LeaderLease
from nvcf_mono.testing.nats_server import NatsServer
from tests.conftest import connect

TTL = 1.2


class LostAnswers:
    """The lease bucket, but the answers to the chosen writes are lost after the writes landed."""

    def __init__(self, kv: TypedKV[Lease], lose: set[int]) -> None:
        self._kv = kv
        self._lose = lose
        self.writes = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._kv, name)

    async def _write(self, call: Callable[[], Any]) -> int:
        self.writes += 1
        revision: int = await call()
        if self.writes in self._lose:
            raise RequestTimeout("write nvcf_leases/reconciler: no answer from JetStream in time")  # it landed
        return revision

    async def create(self, key: str, value: Lease, *, ttl: float | None = None) -> int:
        return await self._write(lambda: self._kv.create(key, value, ttl=ttl))

    async def update(self, key: str, value: Lease, *, revision: int, ttl: float | None = None) -> int:
        return await self._write(lambda: self._kv.update(key, value, revision=revision, ttl=ttl))


async def _lead_for(lease: LeaderLease, seconds: float) -> list[str]:
    """Run the lease for ``seconds``; what happened to leadership meanwhile."""
    events: list[str] = []

    async def lead() -> None:
        events.append("leading")
        try:
            await anyio.sleep_forever()
        finally:
            events.append("stepped down")

    with anyio.move_on_after(seconds):
        await lease.run(lead)
    return events


async def test_a_renewal_that_landed_unanswered_keeps_the_lease(nats_server: NatsServer, unique: Any) -> None:
    async with connect(nats_server.url) as bus:
        bucket = await bus.ensure_bucket(BucketSpec(name=unique("leases"), per_key_ttl=True))
        kv = LostAnswers(TypedKV(bucket, LEASE), lose={2, 4})  # the first renewal's answer, then another's
        lease = LeaderLease(kv, "reconciler", node="cp", ttl=TTL, log=logging.getLogger("test"))  # type: ignore[arg-type]
        events = await _lead_for(lease, TTL * 3)
        assert kv.writes >= 6, "it kept renewing"
        assert events == ["leading", "stepped down"], events  # stepped down only when the test ended
        current = await TypedKV(bucket, LEASE).get("reconciler")
        assert current is not None and current.value.holder == lease.holder


async def test_a_create_that_landed_unanswered_is_taken_back_not_waited_out(
    nats_server: NatsServer, unique: Any
) -> None:
    async with connect(nats_server.url) as bus:
        bucket = await bus.ensure_bucket(BucketSpec(name=unique("leases"), per_key_ttl=True))
        kv = LostAnswers(TypedKV(bucket, LEASE), lose={1})
        lease = LeaderLease(kv, "reconciler", node="cp", ttl=TTL * 5, log=logging.getLogger("test"))  # type: ignore[arg-type]
        events = await _lead_for(lease, TTL * 3)  # well within the lease's TTL (6 s): not waited out
        assert events == ["leading", "stepped down"], events


async def test_another_holders_lease_is_never_taken(nats_server: NatsServer, unique: Any) -> None:
    async with connect(nats_server.url) as bus:
        bucket = await bus.ensure_bucket(BucketSpec(name=unique("leases"), per_key_ttl=True))
        kv = TypedKV(bucket, LEASE)
        now = now_iso()
        await kv.create("reconciler", Lease(holder="cp-other:1", acquired_at=now, renewed_at=now), ttl=60)
        lease = LeaderLease(kv, "reconciler", node="cp", ttl=TTL, log=logging.getLogger("test"))
        assert await _lead_for(lease, TTL * 2) == []
