"""Queued bytes, held to ``queue_max_bytes`` per version and ``account_queue_max_bytes`` per account.

A JetStream byte limit reserves its whole size out of the server's store when the stream is made,
so it cannot be the per-version limit of a platform with thousands of versions. Instead each node
keeps, per version, the stream's size at its last look, what it stored that the look did not see
(told by sequence), and what it admitted that is still on its way. Its first publish to a version
looks first (what the queue held before this node counted: a restart, other nodes); after that, far
below the limit a publish costs no call at all; past half of it the node looks again (at most every
``REFRESH`` seconds) and refuses what would not fit. A node counts its own stores whole (but for each
message's few bytes of subject and headers), however fast they come; several nodes together may
overshoot by what the others stored since a node's last look, which is bounded by the refresh period.

An account's versions together are held the same way, so that one account with many versions cannot
fill the store every account's requests wait in: its look is one listing of every request stream's
size (a call per 256 streams), summed over the account's versions.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from typing import final

import anyio
import attrs

from nvcf_mono.bus.api import Stream, StreamState
from nvcf_mono.bus.errors import BusError, NotFound
from nvcf_mono.http.problem import ProblemError

#: Least seconds between two looks at one version's stream size.
REFRESH = 0.25
#: Stores remembered between two looks; past it, far below the limit, they are folded into the count
#: (no call): memory grows with what is stored between looks, not with history.
MAX_REMEMBERED = 256

#: A look at some request queues: their state by version id.
Look = Callable[[], Awaitable[Mapping[str, StreamState]]]


@attrs.define
class _Seen:
    """Queued bytes as far as this node knows: the streams' bytes at the last look, what this node stored
    since that the look did not see, and what it admitted that is still on its way.

    A look tells which of this node's stores it saw by sequence, not by time: a stream's snapshot holds
    every message up to its last sequence, so a store acknowledged with a higher one is counted on top,
    however slowly the look's answer came back (counting by time forgot a burst stored while a look was
    under way, and let it in twice over).
    """

    stored: int = 0
    #: This node's stores the last look did not see: (version id, sequence) -> (bytes, looks begun before it).
    since: dict[tuple[str, int], tuple[int, int]] = attrs.field(factory=dict)
    published: int = 0  # the sum of ``since``
    #: Each version's last sequence at the last look: a store at or below it was seen.
    looked: dict[str, int] = attrs.field(factory=dict)
    #: Admitted, not yet stored: a look cannot have seen these, so it never takes them off.
    pending: int = 0
    looks: int = 0
    at: float = -REFRESH
    #: A look has answered: until one has, the count says nothing of what the queue held before this
    #: node counted (a restarted node, a queue filled through other nodes).
    known: bool = False
    looking: anyio.Event | None = None

    @property
    def held(self) -> int:
        return self.stored + self.published + self.pending

    def add(self, version_id: str, seq: int, size: int) -> None:
        """Count a store of this node: ``size`` bytes at ``seq`` in the version's stream."""
        if seq > self.looked.get(version_id, 0):  # else the last look (answered first) saw it
            self.since[(version_id, seq)] = (size, self.looks)
            self.published += size

    async def fits(self, size: int, limit: int, look: Look) -> bool:
        """Whether ``size`` more stays within ``limit``: far below it by the count alone (no call at all),
        past half of it after a look at the queues (unless one was just made).
        """
        if self.known and self.held + size <= limit // 2:
            if len(self.since) >= MAX_REMEMBERED and self.looking is None:  # a look under way sorts them
                self._fold()
            return True
        now = time.monotonic()
        if self.looking is None and now - self.at >= REFRESH:
            self.at = now  # one look at a time: calls in the meantime go by the estimate (once there is one)
            self.looks += 1
            self.looking = looking = anyio.Event()
            try:
                self._saw(await look(), begun=self.looks)
                self.known = True
            except BusError:
                pass  # the stream cannot be asked now (a leader being elected): the estimate decides
            finally:
                self.looking = None
                looking.set()
        elif not self.known and self.looking is not None:
            await self.looking.wait()
        return self.held + size <= limit

    def _fold(self) -> None:
        """Count the stores remembered since the last look as stored: what the queue holds at most
        (until its consumers take them), and no call to make far below the limit.
        """
        self.stored += self.published
        self.published = 0
        self.since = {}

    def _saw(self, states: Mapping[str, StreamState], *, begun: int) -> None:
        self.stored = sum(state.bytes for state in states.values())
        self.looked = {version_id: state.last_seq for version_id, state in states.items()}
        kept = {}
        for (version_id, seq), (size, before) in self.since.items():
            last = self.looked.get(version_id)
            if last is None:
                # No stream at the look: one removed takes its requests with it, but a store made while
                # the look was under way may be in a stream made after its snapshot.
                if before >= begun:
                    kept[(version_id, seq)] = (size, before)
            elif seq > last:
                kept[(version_id, seq)] = (size, before)
        self.since = kept
        self.published = sum(size for size, _ in kept.values())

    def forget(self, version_id: str) -> None:
        """The version's stream is gone: its stores with it, and a new one starts again from sequence 1."""
        self.looked.pop(version_id, None)
        gone = [key for key in self.since if key[0] == version_id]
        for key in gone:
            self.published -= self.since.pop(key)[0]


@attrs.define
class Admission:
    """Bytes admitted to a version's queue (and its account's), on their way to the stream.

    ``stored(seq)`` once the stream took them; ``withdraw()`` when it did not (or it already had them:
    a duplicate). Until either, they count as pending, which no look at the stream takes off.
    """

    function_version_id: str
    size: int
    counts: tuple[_Seen, ...]
    settled: bool = False

    def stored(self, seq: int) -> None:
        if self._settle():
            for seen in self.counts:
                seen.add(self.function_version_id, seq, self.size)

    def withdraw(self) -> None:
        self._settle()

    def _settle(self) -> bool:
        if self.settled:
            return False
        self.settled = True
        for seen in self.counts:
            seen.pending -= self.size
        return True


@final
class QueueQuota:
    """Per version: bytes in its request stream, as far as this node knows."""

    def __init__(
        self,
        limit: int,
        *,
        account_limit: int = 0,
        queued: Look | None = None,
        account_of: Callable[[str], str | None] = lambda _version: None,
    ) -> None:
        self.limit = limit
        self._seen: dict[str, _Seen] = {}
        #: 0: no account limit. ``queued()``: every version's request queue; ``account_of``: whose.
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
        if not await seen.fits(size, self.limit, partial(_stream_state, stream, function_version_id)):
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
            if not await owner.fits(size, self.account_limit, partial(self._account_queues, account)):
                raise ProblemError(
                    429,
                    f"the account's request queues are full ({owner.held} bytes queued over its "
                    f"functions, limit {self.account_limit}); retry later, or let its queued requests drain first",
                    headers={"Retry-After": "5"},
                )
            counts = (seen, owner)
        for each in counts:
            each.pending += size
        return Admission(function_version_id, size, counts)

    async def _account_queues(self, account: str) -> dict[str, StreamState]:
        """The account's request queues: one listing of every request queue."""
        assert self._queued is not None  # an account limit is kept only with a listing
        queued = await self._queued()
        return {version: state for version, state in queued.items() if self._account_of(version) == account}

    def forget(self, function_version_id: str) -> None:
        """The version's queue is gone."""
        self._seen.pop(function_version_id, None)
        account = self._account_of(function_version_id)
        owner = None if account is None else self._accounts.get(account)
        if owner is not None:
            owner.forget(function_version_id)


async def _stream_state(stream: Stream, function_version_id: str) -> dict[str, StreamState]:
    try:
        return {function_version_id: await stream.info()}
    except NotFound:
        return {}
