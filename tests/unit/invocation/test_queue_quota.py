"""Queued bytes per version and per account: refused with 429 past either limit, counted without a call far below."""

from __future__ import annotations

from typing import Any

import pytest

from nvcf_mono.http.problem import ProblemError
from nvcf_mono.planes.invocation import quota as quota_module
from nvcf_mono.planes.invocation.quota import QueueQuota

OWNERS = {"a1": "acct-a", "a2": "acct-a", "a3": "acct-a", "b1": "acct-b"}


class Queues:
    """What the request streams hold (bytes per version), and how often they were listed."""

    def __init__(self) -> None:
        self.bytes: dict[str, int] = {}
        self.listings = 0

    async def listing(self) -> dict[str, int]:
        self.listings += 1
        return dict(self.bytes)


class Stream:
    def __init__(self, queues: Queues, version: str) -> None:
        self.queues, self.version = queues, version

    async def info(self) -> Any:
        return type("State", (), {"bytes": self.queues.bytes.get(self.version, 0)})()


async def queue(quota: QueueQuota, queues: Queues, version: str, size: int) -> None:
    admission = await quota.admit(Stream(queues, version), version, size, account=OWNERS[version])  # type: ignore[arg-type]
    queues.bytes[version] = queues.bytes.get(version, 0) + size  # stored, as JetStream would
    admission.stored()


async def test_an_accounts_versions_together_are_held_to_its_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(quota_module, "REFRESH", 0.0)  # every estimate past half a limit is looked at again
    queues = Queues()
    quota = QueueQuota(1000, account_limit=1500, queued=queues.listing, account_of=OWNERS.get)
    for version in ("a1", "a2"):
        for _ in range(7):
            await queue(quota, queues, version, 100)  # 700 each: within the version's 1000
    assert queues.listings >= 1  # past half of the account's limit it looked
    with pytest.raises(ProblemError) as full:
        await queue(quota, queues, "a3", 200)  # a third version would pass the account's 1500
    assert full.value.status == 429 and "account's request queues are full" in full.value.detail
    assert full.value.headers["Retry-After"] == "5"
    await queue(quota, queues, "b1", 900)  # another account's queues are its own
    queues.bytes["a1"] = 0  # a1's requests were served
    await queue(quota, queues, "a3", 200)


async def test_far_below_the_limit_no_listing_is_made_and_no_account_means_no_account_limit() -> None:
    queues = Queues()
    quota = QueueQuota(10_000, account_limit=10_000, queued=queues.listing, account_of=OWNERS.get)
    for _ in range(40):
        await queue(quota, queues, "a1", 100)
    assert queues.listings == 0
    unlimited = QueueQuota(10_000)  # no listing given: only the version limit
    for _ in range(50):
        await unlimited.admit(Stream(queues, "b1"), "b1", 100, account="acct-b")  # type: ignore[arg-type]
    assert unlimited.account_limit == 0


async def test_admitted_bytes_still_on_their_way_are_not_taken_off_by_a_look(monkeypatch: pytest.MonkeyPatch) -> None:
    """A burst admitted at once is published after its admissions: a look made before any of it landed
    sees an empty queue, and must not forget the burst (the fault: every call of a burst got in).
    """
    monkeypatch.setattr(quota_module, "REFRESH", 0.0)
    queues = Queues()
    quota = QueueQuota(1000, account_limit=1500, queued=queues.listing, account_of=OWNERS.get)
    on_the_way = [await quota.admit(Stream(queues, "a1"), "a1", 100, account="acct-a") for _ in range(9)]  # type: ignore[arg-type]
    with pytest.raises(ProblemError) as full:
        await quota.admit(Stream(queues, "a1"), "a1", 200, account="acct-a")  # type: ignore[arg-type]
    assert full.value.status == 429 and "900 bytes queued" in full.value.detail
    for admission in on_the_way[:4]:
        admission.withdraw()  # four were not stored after all
    on_the_way[4].stored()
    on_the_way[4].withdraw()  # settled once: a second settlement changes nothing
    queues.bytes["a1"] = 100
    await queue(quota, queues, "a1", 500)  # 100 stored + 400 on the way + 500
    with pytest.raises(ProblemError):
        await queue(quota, queues, "a1", 100)
    # the account: 1000 in a1, 500 more on the way in a2 would pass 1500
    await quota.admit(Stream(queues, "a2"), "a2", 400, account="acct-a")  # type: ignore[arg-type]
    with pytest.raises(ProblemError) as account_full:
        await quota.admit(Stream(queues, "a2"), "a2", 200, account="acct-a")  # type: ignore[arg-type]
    assert "account's request queues are full" in account_full.value.detail
