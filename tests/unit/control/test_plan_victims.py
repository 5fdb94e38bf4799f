"""Which instances ``scale`` reaps first: idle running ones, then those not serving yet, busy ones last."""

from __future__ import annotations

from datetime import UTC, datetime

from nvcf_mono.models.placement import Phase, SpecPlacement
from nvcf_mono.planes.control.catalog import Capacity
from nvcf_mono.planes.control.reconcile.plan import scale
from tests.support import placements
from tests.support.placements import placed

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


# The busy one is the newest and the starting one the oldest, so the order is not the age order.
IDLE = placed("i-idle", Phase.RUNNING, created_at="2026-01-01T11:00:00.000Z")
BUSY = placed("i-busy", Phase.RUNNING, created_at="2026-01-01T11:30:00.000Z")
STARTING = placed("i-starting", Phase.STARTING, created_at="2026-01-01T10:30:00.000Z")


def _scale(ledger: SpecPlacement, desired: int, busy: frozenset[str]) -> SpecPlacement:
    return scale(ledger, desired=desired, sites=[], capacity=Capacity(), region_of={}, now=NOW, busy=busy)


def _phases(ledger: SpecPlacement) -> dict[str | None, Phase]:
    return {i.instance_id: i.phase for i in ledger.instances}


def test_down_to_one_keeps_the_busy_instance() -> None:
    out = _scale(placements.ledger(IDLE, BUSY, STARTING), 1, frozenset({"i-busy"}))
    assert _phases(out) == {
        "i-idle": Phase.TERMINATING,
        "i-starting": Phase.TERMINATING,
        "i-busy": Phase.RUNNING,
    }
    reaped = [i for i in out.instances if i.phase is Phase.TERMINATING]
    assert {i.termination_reason for i in reaped} == {"scale-down"}
    assert all(not i.published for i in reaped)
    assert out.desired == 1
    assert out.waiting == 0


def test_down_to_two_reaps_only_the_idle_running_instance() -> None:
    out = _scale(placements.ledger(IDLE, BUSY, STARTING), 2, frozenset({"i-busy"}))
    assert _phases(out) == {
        "i-idle": Phase.TERMINATING,
        "i-starting": Phase.STARTING,
        "i-busy": Phase.RUNNING,
    }
    assert out.desired == 2


def test_down_to_zero_reaps_the_busy_instance_too() -> None:
    out = _scale(placements.ledger(IDLE, BUSY, STARTING), 0, frozenset({"i-busy"}))
    assert set(_phases(out).values()) == {Phase.TERMINATING}


def test_without_busy_running_instances_go_before_starting_ones() -> None:
    out = _scale(placements.ledger(IDLE, BUSY, STARTING), 1, frozenset())
    # Both running ones go (the newer first), the starting one stays.
    assert _phases(out) == {
        "i-idle": Phase.TERMINATING,
        "i-starting": Phase.STARTING,
        "i-busy": Phase.TERMINATING,
    }


def test_newest_idle_running_instance_goes_first() -> None:
    older = placed("i-older", Phase.RUNNING, created_at="2026-01-01T09:00:00.000Z")
    newer = placed("i-newer", Phase.RUNNING, created_at="2026-01-01T11:00:00.000Z")
    out = _scale(placements.ledger(older, newer), 1, frozenset())
    assert _phases(out) == {"i-older": Phase.RUNNING, "i-newer": Phase.TERMINATING}


def test_busy_ids_of_other_versions_change_nothing() -> None:
    out = _scale(placements.ledger(IDLE, BUSY, STARTING), 2, frozenset({"i-elsewhere"}))
    # Without a busy instance, the newest running one goes.
    assert _phases(out)["i-busy"] is Phase.TERMINATING
    assert _phases(out)["i-idle"] is Phase.RUNNING


def test_terminating_instances_do_not_count_as_live() -> None:
    gone = placed("i-gone", Phase.TERMINATING, created_at="2026-01-01T11:45:00.000Z")
    out = _scale(placements.ledger(IDLE, BUSY, gone), 2, frozenset({"i-busy"}))
    assert out.instances == placements.ledger(IDLE, BUSY, gone).instances
    assert out.desired == 2
