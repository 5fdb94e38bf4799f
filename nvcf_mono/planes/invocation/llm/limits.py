"""Request and token limits per account and per API key: token buckets refilled over a minute.

A call takes one request and its estimated tokens (prompt characters / 4, plus ``max_tokens``) when it
is admitted; when it ends, the estimate is replaced by the usage the function reported. A bucket that
cannot pay answers 429 with ``Retry-After``: the seconds until it can. A full bucket is forgotten, so
memory follows the callers of the last minute.

Several invocation nodes. Each node's buckets hold the whole limit, with no I/O per call, and each node
takes from them what the others took as well: what was taken here since the last report is handed out
by :meth:`Limits.taken` (the node publishes it, :mod:`.sharing`), and the others' reports come in through
:meth:`Limits.take`. So a caller finds the same bucket whichever node its calls reach (an OpenAI client
keeps its connection to one of them). What the nodes admit together may pass the limit by what the
others took within one report interval, not yet heard.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from nvcf_mono.auth.principal import Principal
from nvcf_mono.planes.invocation.llm.errors import GatewayError
from nvcf_mono.planes.invocation.llm.settings import LlmGatewaySettings

#: Tokens assumed for a call that does not say how many it wants.
DEFAULT_MAX_TOKENS = 256
_MAX_TOKEN_FIELDS = ("max_completion_tokens", "max_tokens", "max_output_tokens")


def estimate_tokens(doc: Mapping[str, Any], body_size: int) -> int:
    """What a call may cost before it runs: its text at 4 characters a token, plus what it may produce."""
    wanted = next((doc[f] for f in _MAX_TOKEN_FIELDS if isinstance(doc.get(f), int) and doc[f] > 0), None)
    return math.ceil(body_size / 4) + (wanted if wanted is not None else DEFAULT_MAX_TOKENS)


@attrs.define
class Bucket:
    capacity: float
    level: float
    at: float

    def refill(self, now: float) -> None:
        self.level = min(self.capacity, self.level + (now - self.at) * self.capacity / 60.0)
        self.at = now

    def wait(self, cost: float) -> float:
        """Seconds until the bucket holds ``cost`` (0: now)."""
        missing = min(cost, self.capacity) - self.level
        return 0.0 if missing <= 0 else missing * 60.0 / self.capacity


def duration(seconds: float) -> str:
    """A wait as OpenAI writes one in its headers: ``250ms``, ``12s``, ``1m30s``."""
    ms = max(0, math.ceil(seconds * 1000))
    if ms < 1000:
        return f"{ms}ms"
    minutes, rest = divmod(ms, 60_000)
    text = f"{rest / 1000:.3f}".rstrip("0").rstrip(".") + "s"
    return f"{minutes}m{text}" if minutes else text


def _tiers(principal: Principal) -> list[tuple[str, str]]:
    """The buckets' owners a call pays: its account, and its API key when it has one."""
    tiers = [("account", principal.account)]
    if principal.key_id is not None:
        tiers.append(("key", principal.key_id))
    return tiers


Key = tuple[str, str, str]
"""A bucket: (``account`` or ``key``, its id, ``requests`` or ``tokens``)."""
SCOPES = ("account", "key")
KINDS = ("requests", "tokens")


@attrs.define
class Lease:
    """What an admitted call took; :meth:`settle` corrects the tokens once its usage is known."""

    limits: Limits
    token_keys: list[Key]
    estimate: int
    #: OpenAI's ``x-ratelimit-*`` answer headers as the call left the buckets (empty without limits).
    headers: dict[str, str] = attrs.field(factory=dict)

    def settle(self, used: int | None) -> None:
        if used is None:
            return
        for key in self.token_keys:
            self.limits.charge(key, used - self.estimate)  # may go below 0: the next calls wait for it
        self.estimate = used


class Limits:
    """The gateway's request and token limits."""

    def __init__(self, settings: LlmGatewaySettings, clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.clock = clock
        self._buckets: dict[Key, Bucket] = {}
        #: Taken here since the last :meth:`taken`; kept only while another node hears of it.
        self._taken: dict[Key, float] = {}
        self.sharing = False
        self._swept_at = -math.inf

    @property
    def limited(self) -> bool:
        """Whether any limit is set."""
        return any(self.limit(scope, kind) > 0 for scope in SCOPES for kind in KINDS)

    def limit(self, scope: str, kind: str) -> int:
        """A bucket's limit a minute (0: none)."""
        s = self.settings
        if scope == "account":
            return s.requests_per_minute if kind == "requests" else s.tokens_per_minute
        return s.key_requests_per_minute if kind == "requests" else s.key_tokens_per_minute

    def admit(self, principal: Principal, estimate: int) -> Lease:
        """Take one request and ``estimate`` tokens from every bucket that applies, or 429."""
        tiers = _tiers(principal)
        now = self.clock()
        self._forget_full(now)
        charges: list[tuple[Key, float]] = []
        for scope, ident in tiers:
            for kind, cost in (("requests", 1.0), ("tokens", float(estimate))):
                limit = self.limit(scope, kind)
                if limit <= 0:
                    continue
                key = (scope, ident, kind)
                bucket = self._bucket(key, limit, now)
                wait = bucket.wait(cost)
                if wait > 0:
                    raise GatewayError(
                        429,
                        f"Rate limit reached for {kind} per minute on this {scope}: limit {limit}; "
                        f"try again in {math.ceil(wait)}s.",
                        headers={"Retry-After": str(max(1, math.ceil(wait))), **self.rate_headers(tiers, now)},
                    )
                charges.append((key, min(cost, bucket.capacity)))
        for key, cost in charges:
            self.charge(key, cost)
        tokens = [key for key, _ in charges if key[2] == "tokens"]
        return Lease(self, tokens, estimate, self.rate_headers(tiers, now) if charges else {})

    def rate_headers(self, tiers: list[tuple[str, str]], now: float) -> dict[str, str]:
        """OpenAI's ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}``: for each kind, the caller's
        bucket with the least left (its account's or its key's), and how long until it is full again.
        """
        headers: dict[str, str] = {}
        for kind in KINDS:
            buckets = [
                self._bucket((scope, ident, kind), limit, now)
                for scope, ident in tiers
                if (limit := self.limit(scope, kind)) > 0
            ]
            if not buckets:
                continue
            low = min(buckets, key=lambda b: b.level)
            headers[f"x-ratelimit-limit-{kind}"] = str(int(low.capacity))
            headers[f"x-ratelimit-remaining-{kind}"] = str(max(0, math.floor(low.level)))
            headers[f"x-ratelimit-reset-{kind}"] = duration((low.capacity - low.level) * 60.0 / low.capacity)
        return headers

    def charge(self, key: Key, amount: float) -> None:
        """Take ``amount`` from a bucket for a call of this node (a negative amount gives back)."""
        bucket = self._buckets.get(key)
        if bucket is not None:
            bucket.level -= amount
        if self.sharing and amount:
            self._taken[key] = self._taken.get(key, 0.0) + amount

    def taken(self) -> dict[Key, float]:
        """What this node's calls took since the last time it was asked (for the other nodes)."""
        taken, self._taken = self._taken, {}
        return {key: amount for key, amount in taken.items() if amount}

    def take(self, key: Key, amount: float) -> None:
        """Take what another node's calls took."""
        limit = self.limit(key[0], key[2])
        if limit > 0:
            now = self.clock()
            self._forget_full(now)  # a node that only hears of callers forgets them too
            self._bucket(key, limit, now).level -= amount

    def _bucket(self, key: Key, limit: int, now: float) -> Bucket:
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = Bucket(capacity=float(limit), level=float(limit), at=now)
            return bucket
        bucket.refill(now)
        return bucket

    def _forget_full(self, now: float) -> None:
        # At most once a second: with many callers active, not a scan of them all per call.
        if len(self._buckets) < 1024 or now - self._swept_at < 1.0:
            return
        self._swept_at = now
        for key, bucket in list(self._buckets.items()):
            bucket.refill(now)
            if bucket.level >= bucket.capacity:
                del self._buckets[key]
