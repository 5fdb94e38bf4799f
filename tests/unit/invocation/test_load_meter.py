"""The invocation node's load meter (reports and wakes) and the wait reason read from placements."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, cast

import pytest

from nvcf_mono.bus.api import Bus
from nvcf_mono.contracts.load import LATENCY_BOUNDS_MS, InstanceLoad, LoadReport, VersionLoad, wake_subject
from nvcf_mono.models.placement import Phase, SpecPlacement
from nvcf_mono.models.wait_reason import (
    COLD_STARTING,
    INSTANCE_FAILING,
    NO_CAPACITY,
    QUEUED,
    wait_reason,
)
from nvcf_mono.planes.invocation import load as load_module
from nvcf_mono.planes.invocation.load import WAKE_EVERY, LoadMeter
from tests.support import placements
from tests.support.placements import placed

FID = "fn-1"
FVID = "fv-1"
STAMP = "2026-01-01T00:00:00.000Z"


@dataclass
class FakeSession:
    """What LoadMeter reads of a WorkerSession."""

    id: str
    instance_id: str
    function_id: str = FID
    function_version_id: str = FVID
    max_concurrency: int = 4
    draining: bool = False
    busy_seconds: float = 0.0
    reported_in_flight: int = 0
    serving: bool = True


@dataclass
class FakeBus:
    published: list[tuple[str, bytes]] = field(default_factory=list)

    async def publish(self, subject: str, data: bytes = b"", **kw: Any) -> None:
        self.published.append((subject, data))


@dataclass
class Clock:
    now: float = 1000.0

    def monotonic(self) -> float:
        return self.now


def _meter(
    sessions: list[FakeSession] | None = None,
    placements: dict[str, list[SpecPlacement]] | None = None,
    bus: FakeBus | None = None,
) -> LoadMeter:
    live = sessions if sessions is not None else []
    ledgers = placements if placements is not None else {}
    return LoadMeter(
        cast(Bus, bus if bus is not None else FakeBus()),
        node="node-a",
        interval=1.0,
        sessions=lambda: list(live),
        placements=lambda fid, fvid: ledgers.get(fvid, []),
        log=logging.getLogger("test.load"),
    )


def _version(report: LoadReport, fvid: str = FVID) -> VersionLoad:
    [v] = [v for v in report.versions if v.function_version_id == fvid]
    return v


# --- LoadMeter.report --------------------------------------------------------------------------------


def test_first_report_of_a_session_is_its_baseline() -> None:
    s = FakeSession(id="s-1", instance_id="i-1", busy_seconds=500.0, reported_in_flight=2)
    report = _meter([s]).report(10.0)
    assert report.node == "node-a"
    assert report.interval == 1.0
    v = _version(report)
    assert v.function_id == FID
    assert v.busy_seconds == 0.0
    assert v.slot_seconds == 0.0
    assert v.invocations == 0
    assert v.instances == (InstanceLoad(instance_id="i-1", in_flight=2, slots=4, ready=True),)


def test_second_report_is_the_increase_since_the_first() -> None:
    s = FakeSession(id="s-1", instance_id="i-1", max_concurrency=4, busy_seconds=500.0)
    meter = _meter([s])
    meter.report(10.0)
    s.busy_seconds = 503.0
    v = _version(meter.report(12.0))
    assert v.busy_seconds == 3.0
    assert v.slot_seconds == 8.0  # 4 slots * 2 s
    s.busy_seconds = 504.5
    v = _version(meter.report(13.0))
    assert v.busy_seconds == 1.5
    assert v.slot_seconds == 4.0


def test_non_serving_session_has_no_slot_time() -> None:
    s = FakeSession(id="s-1", instance_id="i-1", serving=False, busy_seconds=1.0)
    meter = _meter([s])
    meter.report(10.0)
    s.busy_seconds = 2.0
    v = _version(meter.report(12.0))
    assert v.busy_seconds == 1.0
    assert v.slot_seconds == 0.0
    assert v.instances[0].ready is False


def test_busy_counter_going_back_counts_as_zero() -> None:
    s = FakeSession(id="s-1", instance_id="i-1", busy_seconds=100.0)
    meter = _meter([s])
    meter.report(10.0)
    s.busy_seconds = 5.0  # the worker restarted its counter
    assert _version(meter.report(11.0)).busy_seconds == 0.0
    s.busy_seconds = 6.0
    assert _version(meter.report(12.0)).busy_seconds == 1.0


def test_sessions_of_one_version_are_summed() -> None:
    a = FakeSession(id="s-a", instance_id="i-a", max_concurrency=4, busy_seconds=10.0, reported_in_flight=1)
    b = FakeSession(id="s-b", instance_id="i-b", max_concurrency=2, busy_seconds=20.0, reported_in_flight=2)
    meter = _meter([a, b])
    meter.report(10.0)
    a.busy_seconds, b.busy_seconds = 12.0, 21.0
    v = _version(meter.report(11.0))
    assert v.busy_seconds == 3.0
    assert v.slot_seconds == 6.0  # (4 + 2) slots * 1 s
    assert {i.instance_id: (i.in_flight, i.slots) for i in v.instances} == {"i-a": (1, 4), "i-b": (2, 2)}


def test_versions_are_reported_apart() -> None:
    a = FakeSession(id="s-a", instance_id="i-a")
    b = FakeSession(id="s-b", instance_id="i-b", function_id="fn-2", function_version_id="fv-2")
    report = _meter([a, b]).report(10.0)
    assert [(v.function_id, v.function_version_id) for v in report.versions] == [(FID, FVID), ("fn-2", "fv-2")]
    assert [i.instance_id for i in _version(report, "fv-2").instances] == ["i-b"]


def test_session_that_disappears_is_forgotten() -> None:
    s = FakeSession(id="s-1", instance_id="i-1", busy_seconds=100.0)
    sessions = [s]
    meter = _meter(sessions)
    meter.report(10.0)
    sessions.clear()
    assert meter.report(11.0).versions == ()
    # It comes back with the same id: a new baseline, not an increase over the old one.
    s.busy_seconds = 150.0
    sessions.append(s)
    v = _version(meter.report(20.0))
    assert v.busy_seconds == 0.0
    assert v.slot_seconds == 0.0


def test_no_sessions_and_no_invocations_is_an_empty_report() -> None:
    assert _meter().report(10.0).versions == ()


def test_answers_are_counted_by_status_and_latency_bucket_once() -> None:
    meter = _meter()
    for status, seconds in ((200, 0.004), (200, 0.004), (503, 0.2), (499, 40.0), (200, 9999.0)):
        meter.answered(FID, FVID, status, seconds)
    v = _version(meter.report(10.0))
    assert v.errors == 2 and sum(v.latency) == 5
    assert len(v.latency) == len(LATENCY_BOUNDS_MS) + 1
    assert v.latency[LATENCY_BOUNDS_MS.index(5)] == 2  # 4 ms: up to 5 ms
    assert v.latency[LATENCY_BOUNDS_MS.index(250)] == 1 and v.latency[LATENCY_BOUNDS_MS.index(60000)] == 1
    assert v.latency[-1] == 1  # beyond the last bound
    assert meter.report(11.0).versions == ()


# --- LoadMeter.queued ------------------------------------------------------------------------------


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(load_module, "time", SimpleNamespace(monotonic=c.monotonic, time=lambda: 1.7e9))
    return c


async def test_queued_counts_invocations_into_the_next_report(clock: Clock) -> None:
    meter = _meter(placements={FVID: [placements.ledger(placed("i-1", Phase.RUNNING, created_at=STAMP))]})
    for _ in range(3):
        await meter.queued(FID, FVID)
    await meter.queued("fn-2", "fv-2")
    report = meter.report(10.0)
    assert _version(report).invocations == 3
    other = _version(report, "fv-2")
    assert (other.invocations, other.busy_seconds, other.slot_seconds, other.instances) == (1, 0.0, 0.0, ())
    # Counted once: the following report starts from zero.
    assert meter.report(11.0).versions == ()


async def test_queued_counts_into_a_version_with_sessions(clock: Clock) -> None:
    s = FakeSession(id="s-1", instance_id="i-1")
    meter = _meter([s], placements={FVID: [placements.ledger(placed("i-1", Phase.RUNNING, created_at=STAMP))]})
    await meter.queued(FID, FVID)
    v = _version(meter.report(10.0))
    assert v.invocations == 1
    assert [i.instance_id for i in v.instances] == ["i-1"]


async def test_queued_wakes_a_version_with_no_running_instance(clock: Clock) -> None:
    bus = FakeBus()
    meter = _meter(placements={FVID: [placements.ledger(placed("i-1", Phase.STARTING, created_at=STAMP))]}, bus=bus)
    await meter.queued(FID, FVID)
    assert bus.published == [(wake_subject(FVID), FID.encode())]
    assert bus.published[0][0] == f"nvcf.wake.{FVID}"


async def test_queued_wakes_a_version_with_no_placements(clock: Clock) -> None:
    bus = FakeBus()
    meter = _meter(bus=bus)
    await meter.queued(FID, FVID)
    assert bus.published == [(f"nvcf.wake.{FVID}", FID.encode())]


async def test_queued_does_not_wake_a_version_with_a_running_instance(clock: Clock) -> None:
    bus = FakeBus()
    ledger = placements.ledger(
        placed("i-1", Phase.STARTING, created_at=STAMP), placed("i-2", Phase.RUNNING, created_at=STAMP)
    )
    meter = _meter(placements={FVID: [ledger]}, bus=bus)
    await meter.queued(FID, FVID)
    assert bus.published == []


async def test_queued_wakes_at_most_once_per_wake_every(clock: Clock) -> None:
    bus = FakeBus()
    meter = _meter(bus=bus)
    await meter.queued(FID, FVID)
    clock.now += WAKE_EVERY / 2
    await meter.queued(FID, FVID)
    assert len(bus.published) == 1
    clock.now += WAKE_EVERY / 2
    await meter.queued(FID, FVID)
    assert len(bus.published) == 2
    # Another version has its own budget.
    await meter.queued("fn-2", "fv-2")
    assert [subject for subject, _ in bus.published] == [
        "nvcf.wake.fv-1",
        "nvcf.wake.fv-1",
        "nvcf.wake.fv-2",
    ]
    # Every call still counts as an invocation.
    assert _version(meter.report(clock.now)).invocations == 3


# --- wait_reason -------------------------------------------------------------------------------------


def test_running_instance_means_queued() -> None:
    ledger = placements.ledger(placed("i-1", Phase.RUNNING, created_at=STAMP), consecutive_failures=2)
    assert wait_reason([ledger]) == QUEUED == "queued"


def test_failures_and_nothing_running_means_instance_failing() -> None:
    ledger = placements.ledger(placed("i-1", Phase.STARTING, created_at=STAMP), consecutive_failures=1)
    assert wait_reason([ledger]) == INSTANCE_FAILING == "instance_failing"


def test_nothing_live_and_waiting_means_no_capacity() -> None:
    ledger = placements.ledger(placed("i-1", Phase.TERMINATING, created_at=STAMP), waiting=1, retry_after=None)
    assert wait_reason([ledger]) == NO_CAPACITY == "no_capacity"


def test_waiting_in_backoff_is_not_no_capacity() -> None:
    ledger = placements.ledger(waiting=1, retry_after="2030-01-01T00:00:00.000Z")
    assert wait_reason([ledger]) == COLD_STARTING


@pytest.mark.parametrize("phase", [Phase.REQUESTED, Phase.ACKNOWLEDGED, Phase.STARTING])
def test_starting_instance_means_cold_starting(phase: Phase) -> None:
    ledger = placements.ledger(placed("i-1", phase, created_at=STAMP), waiting=1)
    assert wait_reason([ledger]) == COLD_STARTING == "cold_starting"


def test_no_placements_means_cold_starting() -> None:
    assert wait_reason([]) == COLD_STARTING
    assert wait_reason([placements.ledger()]) == COLD_STARTING
