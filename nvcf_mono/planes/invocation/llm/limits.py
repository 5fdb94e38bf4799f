"""Request and token limits per account and per API key: token buckets refilled over a minute.

A call takes one request and its estimated tokens (prompt characters / 4, plus ``max_tokens``) when it
is admitted; when it ends, the estimate is replaced by the usage the function reported. A bucket that
cannot pay answers 429 with ``Retry-After``: the seconds until it can. A full bucket is forgotten, so
memory follows the callers of the last minute.

Several invocation nodes. Buckets live on each node, with no I/O per call; each node holds
``ceil(limit / N)`` of a limit, ``N`` being the invocation nodes the rate limiter counts (their
announcements on the bus). Together the nodes never admit more than the limit (plus up to one per node
where the limit does not divide), however the callers spread; a spread so uneven that one node gets all
of an account's calls gets ``1/N`` of the limit there. When ``N`` changes, each bucket keeps its fill.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import attrs

from nvcf_mono.auth.principal import Principal
from nvcf_mono.planes.invocation.llm.errors import GatewayError
from nvcf_mono.planes.invocation.llm.settings import LlmGatewaySettings

#: Tokens assumed for a call that does not say how many it wants.
DEFAULT_MAX_TOKENS = 256
_MAX_TOKEN_FIELDS = ("max_completion_tokens", "max_tokens", "max_output_tokens")


def estimate_tokens(doc: dict[str, Any], body_size: int) -> int:
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


@attrs.define
class Lease:
    """What an admitted call took; :meth:`settle` corrects the tokens once its usage is known."""

    token_buckets: list[Bucket]
    estimate: int

    def settle(self, used: int | None) -> None:
        if used is None:
            return
        for bucket in self.token_buckets:
            bucket.level -= used - self.estimate  # may go below 0: the next calls wait for it
        self.estimate = used


class Limits:
    """The gateway's request and token limits."""

    def __init__(
        self,
        settings: LlmGatewaySettings,
        clock: Callable[[], float] = time.monotonic,
        nodes: Callable[[], int] = lambda: 1,
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.nodes = nodes
        self._buckets: dict[tuple[str, str, str], Bucket] = {}

    def admit(self, principal: Principal, estimate: int) -> Lease:
        """Take one request and ``estimate`` tokens from every bucket that applies, or 429."""
        s = self.settings
        tiers = [("account", principal.account, s.requests_per_minute, s.tokens_per_minute)]
        if principal.key_id is not None:
            tiers.append(("key", principal.key_id, s.key_requests_per_minute, s.key_tokens_per_minute))
        now = self.clock()
        nodes = max(1, self.nodes())
        self._forget_full(now)
        charges: list[tuple[Bucket, float, str]] = []
        for scope, ident, requests, tokens in tiers:
            for kind, limit, cost in (("requests", requests, 1.0), ("tokens", tokens, float(estimate))):
                if limit <= 0:
                    continue
                bucket = self._bucket((scope, ident, kind), math.ceil(limit / nodes), now)
                wait = bucket.wait(cost)
                if wait > 0:
                    spread = f" ({nodes} gateway nodes share it)" if nodes > 1 else ""
                    raise GatewayError(
                        429,
                        f"Rate limit reached for {kind} per minute on this {scope}: limit {limit}{spread}; "
                        f"try again in {math.ceil(wait)}s.",
                        headers={"Retry-After": str(max(1, math.ceil(wait)))},
                    )
                charges.append((bucket, min(cost, bucket.capacity), kind))
        for bucket, cost, _ in charges:
            bucket.level -= cost
        return Lease([b for b, _, kind in charges if kind == "tokens"], estimate)

    def _bucket(self, key: tuple[str, str, str], limit: int, now: float) -> Bucket:
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = Bucket(capacity=float(limit), level=float(limit), at=now)
            return bucket
        bucket.refill(now)
        if bucket.capacity != limit:
            # Another share (nodes came or went) or another setting: the bucket keeps its fill.
            bucket.level *= limit / bucket.capacity
            bucket.capacity = float(limit)
        return bucket

    def _forget_full(self, now: float) -> None:
        if len(self._buckets) < 1024:
            return
        for key, bucket in list(self._buckets.items()):
            bucket.refill(now)
            if bucket.level >= bucket.capacity:
                del self._buckets[key]
