"""What the autoscaler knows of each version's load: the invocation nodes' reports, kept for the lookback.

Every control-plane process keeps this book (reports are broadcast), so a process that takes the
lease over has the history already. Times are this process's monotonic clock at receipt.
"""

from __future__ import annotations

import math
import time
from collections import deque
from typing import final

import attrs

from nvcf_mono.contracts.load import LoadReport


@attrs.frozen
class Worker:
    """One connected worker, as last reported."""

    in_flight: int
    slots: int
    ready: bool
    seen: float


@final
class VersionBook:
    """One version: load intervals, workers, and when it was last invoked."""

    def __init__(self) -> None:
        #: (received at, busy slot-seconds, slot-seconds) per report.
        self.intervals: deque[tuple[float, float, float]] = deque()
        self.workers: dict[str, Worker] = {}
        self.last_invoked: float | None = None

    def samples(self, now: float, *, step: float, lookback: float, window: float) -> list[float]:
        """Utilization in percent at ``now``, ``now - step``, ... back to ``lookback``, oldest first.

        A sample is the busy share of slot time over the ``window`` before it; NaN where slots had
        no time (no worker ready), as a TSDB answers 0/0. Points with no report at all are absent.
        """
        points = []
        for k in range(int(lookback // step), -1, -1):
            end = now - k * step
            busy = slots = 0.0
            seen = False
            for at, b, s in self.intervals:
                if end - window < at <= end:
                    busy += b
                    slots += s
                    seen = True
            if seen:
                points.append(100.0 * busy / slots if slots > 0 else math.nan)
        return points

    def connected(self, now: float, fresh: float) -> dict[str, Worker]:
        """Workers heard from within ``fresh`` seconds."""
        return {iid: w for iid, w in self.workers.items() if now - w.seen <= fresh}


@final
class LoadBook:
    """Reports in, per-version views out."""

    def __init__(self, *, keep: float) -> None:
        self._keep = keep
        self.versions: dict[str, VersionBook] = {}

    def version(self, function_version_id: str) -> VersionBook:
        book = self.versions.get(function_version_id)
        if book is None:
            book = self.versions[function_version_id] = VersionBook()
        return book

    def record(self, report: LoadReport, now: float) -> None:
        for v in report.versions:
            book = self.version(v.function_version_id)
            if v.slot_seconds > 0 or v.busy_seconds > 0 or v.instances:
                book.intervals.append((now, v.busy_seconds, v.slot_seconds))
            if v.invocations:
                book.last_invoked = now
            for inst in v.instances:
                book.workers[inst.instance_id] = Worker(
                    in_flight=inst.in_flight, slots=inst.slots, ready=inst.ready, seen=now
                )
        self.forget(now)

    def busy(self, function_version_id: str, fresh: float, now: float | None = None) -> frozenset[str]:
        """Instances of the version with requests in flight (never chosen to scale down)."""
        book = self.versions.get(function_version_id)
        if book is None:
            return frozenset()
        now = time.monotonic() if now is None else now
        return frozenset(iid for iid, w in book.connected(now, fresh).items() if w.in_flight > 0)

    def serving(self, function_version_id: str, fresh: float, now: float | None = None) -> frozenset[str]:
        """Instances of the version whose worker an invocation node reported within ``fresh`` seconds."""
        book = self.versions.get(function_version_id)
        if book is None:
            return frozenset()
        return frozenset(book.connected(time.monotonic() if now is None else now, fresh))

    def invoked(self, function_version_id: str, now: float) -> None:
        """A wake: the version was just invoked."""
        self.version(function_version_id).last_invoked = now

    def forget(self, now: float) -> None:
        horizon = now - self._keep
        for book in self.versions.values():
            while book.intervals and book.intervals[0][0] < horizon:
                book.intervals.popleft()
            for iid in [iid for iid, w in book.workers.items() if w.seen < horizon]:
                del book.workers[iid]
