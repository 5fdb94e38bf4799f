"""Queued bytes, held to ``queue_max_bytes`` per version and ``account_queue_max_bytes`` per account.

A JetStream byte limit reserves its whole size out of the server's store when the stream is made,
so it cannot be the per-version limit of a platform with thousands of versions. Instead each node
keeps, per version, the stream's size at its last look, what it stored since, and what it admitted
that is still on its way: far below the limit a publish costs no call at all; past half of it the
node looks again (at most every ``REFRESH`` seconds) and refuses what would not fit. Several nodes
may together overshoot by what each stored since its last look, which is bounded by the refresh
period.

An account's versions together are held the same way, so that one account with many versions cannot
fill the store every account's requests wait in: its look is one listing of every request stream's
size (a call per 256 streams), summed over the account's versions.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from typing import final

import attrs

from nvcf_mono.bus.api import Stream
from nvcf_mono.bus.errors import NotFound
from nvcf_mono.http.problem import ProblemError

#: Least seconds between two looks at one version's stream size.
REFRESH = 0.25


@attrs.define
class _Seen:
    """A queue's bytes at the last look, what this node stored to it since, and what it has on the way."""

    stored: int = 0
    published: int = 0
    #: Admitted, not yet stored: a look cannot have seen these, so it never takes them off.
    pending: int = 0
    at: float = -REFRESH

    @property
    def held(self) -> int:
        return self.stored + self.published + self.pending

    async def fits(self, size: int, limit: int, look: Callable[[], Awaitable[int]]) -> bool:
        """Whether ``size`` more stays within ``limit``: far below it by the count alone (no call at all),
        past half of it after a look at the queue (unless one was just made).
        """
        if self.held + size <= limit // 2:
            return True
        now = time.monotonic()
        if now - self.at >= REFRESH:
            self.at = now  # one look at a time: calls in the meantime go by the estimate
            self.stored = await look()
            # What was stored before the look began is in what it saw; what was stored while it was
            # made probably is (counting it twice would refuse a whole burst until the next look).
            self.published = 0
        return self.held + size <= limit


@attrs.define
class Admission:
    """Bytes admitted to a version's queue (and its account's), on their way to the stream.

    ``stored()`` once the stream took them; ``withdraw()`` when it did not. Until either, they count
    as pending, which no look at the stream takes off.
    """

    size: int
    counts: tuple[_Seen, ...]
    settled: bool = False

    def stored(self) -> None:
        self._settle(stored=True)

    def withdraw(self) -> None:
        self._settle(stored=False)

    def _settle(self, *, stored: bool) -> None:
        if self.settled:
            return
        self.settled = True
        for seen in self.counts:
            seen.pending -= self.size
            if stored:
                seen.published += self.size


@final
class QueueQuota:
    """Per version: bytes in its request stream, as far as this node knows."""

    def __init__(
        self,
        limit: int,
        *,
        account_limit: int = 0,
        queued: Callable[[], Awaitable[Mapping[str, int]]] | None = None,
        account_of: Callable[[str], str | None] = lambda _version: None,
    ) -> None:
        self.limit = limit
        self._seen: dict[str, _Seen] = {}
        #: 0: no account limit. ``queued()``: bytes queued per version id, every version; ``account_of``: whose.
        self.account_limit = account_limit if queued is not None else 0
        self._queued = queued
        self._account_of = account_of
        self._accounts: dict[str, _Seen] = {}

    def __len__(self) -> int:
        return len(self._seen)

    async def admit(self, stream: Stream, function_version_id: str, size: int, *, account: str = "") -> Admission:
        """Count ``size`` more bytes for the version (and its account), or raise 429 when a queue would be full.

        The caller settles the returned admission once its publish is stored or given up.
        """
        seen = self._seen.get(function_version_id)
        if seen is None:  # not setdefault: no new count made on every call
            seen = self._seen[function_version_id] = _Seen()
        if not await seen.fits(size, self.limit, partial(_stream_bytes, stream)):
            raise ProblemError(
                429,
                f"the function's request queue is full ({seen.held} bytes queued, limit "
                f"{self.limit}); retry later, or raise its maxInstances so it drains faster",
                headers={"Retry-After": "5"},
            )
        counts: tuple[_Seen, ...] = (seen,)
        if self.account_limit and account:
            owner = self._accounts.get(account)
            if owner is None:
                owner = self._accounts[account] = _Seen()
            if not await owner.fits(size, self.account_limit, partial(self._account_bytes, account)):
                raise ProblemError(
                    429,
                    f"the account's request queues are full ({owner.held} bytes queued over its "
                    f"functions, limit {self.account_limit}); retry later, or let its queued requests drain first",
                    headers={"Retry-After": "5"},
                )
            counts = (seen, owner)
        for each in counts:
            each.pending += size
        return Admission(size, counts)

    async def _account_bytes(self, account: str) -> int:
        """Bytes queued over the account's versions: one listing of every request queue."""
        assert self._queued is not None  # an account limit is kept only with a listing
        queued = await self._queued()
        return sum(n for version, n in queued.items() if self._account_of(version) == account)

    def forget(self, function_version_id: str) -> None:
        """The version's queue is gone."""
        self._seen.pop(function_version_id, None)


async def _stream_bytes(stream: Stream) -> int:
    try:
        return (await stream.info()).bytes
    except NotFound:
        return 0
