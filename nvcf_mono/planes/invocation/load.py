"""An invocation node's account of load per function version, for the autoscaler (contracts/load.py).

Workers report their busy slot-seconds (a counter) on the Serve stream every
``load_report_interval``; every interval this node sends the increase per version, the slots'
time, the invocations it queued and each worker's in-flight count. A request queued for a version
with no running instance also sends a wake (at most one per version per ``WAKE_EVERY``).
"""

from __future__ import annotations

import bisect
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Protocol, final

import anyio
from anyio.abc import TaskStatus

from nvcf_mono.bus.api import Bus
from nvcf_mono.bus.errors import BusError
from nvcf_mono.contracts import load
from nvcf_mono.contracts.messages import encode
from nvcf_mono.models.placement import Phase, SpecPlacement

WAKE_EVERY = 0.5


class Session(Protocol):
    """What the meter reads of a worker session (planes/invocation/workers.py)."""

    id: str
    function_id: str
    function_version_id: str
    instance_id: str
    max_concurrency: int
    draining: bool
    busy_seconds: float
    reported_in_flight: int

    @property
    def serving(self) -> bool: ...


@final
class LoadMeter:
    """Counts invocations as they are queued; reports every interval from the live sessions."""

    def __init__(
        self,
        bus: Bus,
        *,
        node: str,
        interval: float,
        sessions: Callable[[], Iterable[Session]],
        placements: Callable[[str, str], list[SpecPlacement]],
        log: logging.Logger,
    ) -> None:
        self._bus = bus
        self._node = node
        self._interval = interval
        self._sessions = sessions
        self._placements = placements
        self._log = log
        self._invocations: Counter[tuple[str, str]] = Counter()
        #: Per version since the last report: answers with an error status, and answers per latency bucket.
        self._errors: Counter[tuple[str, str]] = Counter()
        self._latency: dict[tuple[str, str], list[int]] = {}
        #: Per session: the busy counter and the time at the previous report.
        self._seen: dict[str, tuple[float, float]] = {}
        self._woken: dict[str, float] = {}

    async def queued(self, function_id: str, function_version_id: str) -> None:
        """A request was stored in the version's queue."""
        self._invocations[(function_id, function_version_id)] += 1
        now = time.monotonic()
        # Checked at most every WAKE_EVERY per version: the hot path stays one dict lookup.
        if now - self._woken.get(function_version_id, -WAKE_EVERY) < WAKE_EVERY:
            return
        self._woken[function_version_id] = now
        placements = self._placements(function_id, function_version_id)
        if any(i.phase is Phase.RUNNING for p in placements for i in p.instances):
            return
        try:
            await self._bus.publish(load.wake_subject(function_version_id), function_id.encode())
        except BusError as err:  # the autoscaler's round sees the queue anyway
            self._log.debug("wake for %s not sent: %s", function_version_id, err)

    def answered(self, function_id: str, function_version_id: str, status: int, seconds: float) -> None:
        """An invocation was answered (its traffic for the console's charts)."""
        key = (function_id, function_version_id)
        counts = self._latency.get(key)
        if counts is None:
            counts = self._latency[key] = [0] * (len(load.LATENCY_BOUNDS_MS) + 1)
        counts[bisect.bisect_left(load.LATENCY_BOUNDS_MS, seconds * 1000)] += 1
        if status >= 400:
            self._errors[key] += 1

    def report(self, now: float) -> load.LoadReport:
        """Load since the previous report (and forget sessions that are gone)."""
        versions: dict[tuple[str, str], tuple[float, float, list[load.InstanceLoad]]] = {}
        alive = set()
        for s in self._sessions():
            alive.add(s.id)
            busy_before, at_before = self._seen.get(s.id, (s.busy_seconds, now))
            self._seen[s.id] = (s.busy_seconds, now)
            key = (s.function_id, s.function_version_id)
            busy, slot_time, instances = versions.get(key, (0.0, 0.0, []))
            busy += max(0.0, s.busy_seconds - busy_before)
            if s.serving:
                slot_time += s.max_concurrency * (now - at_before)
            instances.append(
                load.InstanceLoad(
                    instance_id=s.instance_id,
                    in_flight=s.reported_in_flight,
                    slots=s.max_concurrency,
                    ready=s.serving,
                )
            )
            versions[key] = (busy, slot_time, instances)
        for gone in self._seen.keys() - alive:
            del self._seen[gone]
        invocations, self._invocations = self._invocations, Counter()
        errors, self._errors = self._errors, Counter()
        latency, self._latency = self._latency, {}
        for key in (invocations.keys() | latency.keys()) - versions.keys():
            versions[key] = (0.0, 0.0, [])
        stale = now - 60.0
        self._woken = {k: t for k, t in self._woken.items() if t > stale}
        return load.LoadReport(
            node=self._node,
            at=time.time(),
            interval=self._interval,
            versions=tuple(
                load.VersionLoad(
                    function_id=fid,
                    function_version_id=fvid,
                    busy_seconds=round(busy, 6),
                    slot_seconds=round(slot_time, 6),
                    invocations=invocations.get((fid, fvid), 0),
                    instances=tuple(instances),
                    errors=errors.get((fid, fvid), 0),
                    latency=tuple(latency.get((fid, fvid), ())),
                )
                for (fid, fvid), (busy, slot_time, instances) in sorted(versions.items())
            ),
        )

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        subject = load.load_subject(self._node)
        task_status.started()
        while True:
            await anyio.sleep(self._interval)
            report = self.report(time.monotonic())
            if not report.versions:
                continue
            try:
                await self._bus.publish(subject, encode(report))
            except BusError as err:
                self._log.debug("load report not sent: %s", err)
