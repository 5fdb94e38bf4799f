"""The last hour of each function version's traffic, minute by minute, from the invocation nodes' reports.

Every control-plane process hears every node's load report (``contracts/load.py``): invocations
queued, answers with an error status, and answers per latency bucket. Kept per version and minute
for an hour, summed over nodes, they are the traffic charts ``GET /v2/nvcf/stats`` serves. Memory
follows the versions invoked in the last hour, not every version ever invoked.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import final

from nvcf_mono.contracts.load import LATENCY_BOUNDS_MS, LoadReport

STEP = 60
KEEP = 60
#: A minute's counts: invocations, errors, then answers per latency bucket.
_INVOCATIONS, _ERRORS, _LATENCY = 0, 1, 2
_WIDTH = 2 + len(LATENCY_BOUNDS_MS) + 1


@final
class TrafficHistory:
    """Minute buckets per function version (``record`` each report, ``minutes`` to read)."""

    def __init__(self, *, keep: int = KEEP) -> None:
        self._keep = keep
        self._versions: dict[str, dict[int, list[int]]] = {}
        #: The minute of the last pruning: the hour is pruned once a minute, not on every report.
        self._pruned = -1

    def record(self, report: LoadReport) -> None:
        minute = int(report.at // STEP)
        for v in report.versions:
            if not (v.invocations or v.errors or any(v.latency)):
                continue
            minutes = self._versions.setdefault(v.function_version_id, {})
            counts = minutes.get(minute)
            if counts is None:
                counts = minutes[minute] = [0] * _WIDTH
            counts[_INVOCATIONS] += v.invocations
            counts[_ERRORS] += v.errors
            for i, n in enumerate(v.latency[: _WIDTH - _LATENCY]):
                counts[_LATENCY + i] += n
        if minute > self._pruned:
            self._pruned = minute
            self._forget_before(minute - self._keep)

    def _forget_before(self, oldest: int) -> None:
        for version_id in list(self._versions):
            minutes = self._versions[version_id]
            for minute in [m for m in minutes if m < oldest]:
                del minutes[minute]
            if not minutes:
                del self._versions[version_id]

    def minutes(self, version_ids: Iterable[str], *, now: float, count: int) -> list[tuple[int, list[int]]]:
        """The last ``count`` minutes (oldest first, the current one last) summed over ``version_ids``:
        (minute start in unix seconds, counts).
        """
        last = int(now // STEP)
        summed = {m: [0] * _WIDTH for m in range(last - count + 1, last + 1)}
        for version_id in version_ids:
            for minute, counts in self._versions.get(version_id, {}).items():
                into = summed.get(minute)
                if into is not None:
                    for i, n in enumerate(counts):
                        into[i] += n
        return [(m * STEP, summed[m]) for m in sorted(summed)]


def invocations(counts: list[int]) -> int:
    return counts[_INVOCATIONS]


def errors(counts: list[int]) -> int:
    return counts[_ERRORS]


def percentile(counts: list[int], q: float) -> float | None:
    """The ``q`` quantile (0-1) of a minute's latency in ms, interpolated within its bucket; None without answers."""
    buckets = counts[_LATENCY:]
    total = sum(buckets)
    if not total:
        return None
    rank = q * total
    seen = 0
    for i, n in enumerate(buckets):
        if n and seen + n >= rank:
            if i == len(LATENCY_BOUNDS_MS):
                return float(LATENCY_BOUNDS_MS[-1])  # beyond the last bound: it is all that is known
            lower = 0.0 if i == 0 else float(LATENCY_BOUNDS_MS[i - 1])
            return lower + (LATENCY_BOUNDS_MS[i] - lower) * (rank - seen) / n
        seen += n
    return float(LATENCY_BOUNDS_MS[-1])
