"""The autoscaler's decision algorithm against the reference tables (autoscaler.md §2.6, §2.7, sanitize)."""

from __future__ import annotations

import statistics

import pytest

from nvcf_mono.planes.control.autoscale.algorithm import (
    DEFAULT_POLICY,
    Estimate,
    Policy,
    Stickiness,
    decide,
    desired_instances,
    distribute,
    sanitize,
    weighted_average,
    with_backlog,
)

# --- §2.6 default policy (up=70, down=30, up x1.2, down x0.8, no stickiness) ---------------------------


@pytest.mark.parametrize(
    ("samples", "current", "decay", "expected"),
    [
        pytest.param([95.0, 98.0, 92.0], 10, 0.1, 12, id="high-95-98-92-up"),
        pytest.param([75.0, 80.0, 78.0], 10, 0.1, 12, id="moderate-high-75-80-78-up"),
        pytest.param([25.0, 20.0, 28.0], 10, 0.1, 8, id="low-25-20-28-down"),
        pytest.param([5.0, 8.0, 6.0], 10, 0.1, 8, id="very-low-5-8-6-down"),
        pytest.param([5.0, 8.0, 6.0], 1, 0.1, 1, id="very-low-current-1-never-0"),
        pytest.param([25.0, 20.0, 28.0], 1, 0.1, 1, id="low-current-1-stays-1"),
        pytest.param([5.0, 8.0, 6.0], 2, 0.1, 1, id="very-low-current-2-floor-1.6"),
        pytest.param([45.0, 50.0, 55.0], 10, 0.1, 10, id="middle-45-50-55-keep"),
        pytest.param([90.0, 90.0, 5.0], 10, 0.8, 8, id="last-point-5-below-30-down"),
        pytest.param([], 5, 0.1, 5, id="empty-current-5"),
        pytest.param([], 0, 0.1, 1, id="empty-current-0"),
        pytest.param([80.0, 85.0, 90.0], 10, 0.1, 12, id="increasing-80-85-90-up"),
        pytest.param([70.0, 70.0, 70.0], 10, 0.0, 10, id="exactly-70-not-above-up"),
        pytest.param([30.0, 30.0, 30.0], 10, 0.0, 10, id="exactly-30-not-below-down"),
        pytest.param([70.1] * 3, 10, 0.0, 12, id="just-above-70.1-up"),
        pytest.param([29.9] * 3, 10, 0.0, 8, id="just-below-29.9-down"),
        pytest.param([90.0, 90.0, 90.0], 1, 0.0, 2, id="current-1-ceil-1.2"),
        pytest.param([90.0] * 3, 1000, 0.0, 1200, id="large-1000-up"),
        pytest.param([5.0] * 3, 1000, 0.0, 800, id="large-1000-down"),
        pytest.param([90.0, 10.0, 50.0], 10, 0.0, 10, id="last-50-keep"),
        pytest.param([90.0, 90.0, 10.0], 10, 5.0, 8, id="high-decay-last-10-down"),
        pytest.param([150.0, 200.0, 180.0], 10, 0.0, 12, id="over-100-up"),
        pytest.param([0.0, 0.0, 0.0], 10, 0.0, 8, id="all-zero-down"),
    ],
)
def test_desired_instances_default_policy(samples: list[float], current: int, decay: float, expected: int) -> None:
    estimate = desired_instances(samples, DEFAULT_POLICY, current, decay)
    assert estimate.desired == expected
    if not samples:
        assert estimate.average == 0.0
    if samples == [80.0, 85.0, 90.0]:
        assert 80.0 < estimate.average < 90.0


def test_default_policy_values() -> None:
    reference = Policy(
        scale_up_threshold=70.0,
        scale_down_threshold=30.0,
        scale_up_factor=1.2,
        scale_down_factor=0.8,
        scale_up_stickiness=None,
        scale_down_stickiness=None,
    )
    assert reference == DEFAULT_POLICY


# --- §2.6 custom policies ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("up", "down", "up_factor", "down_factor", "up_sticky", "down_sticky", "samples", "current", "expected"),
    [
        pytest.param(60.0, 40.0, 1.2, 0.8, None, None, [55.0, 55.0, 55.0], 10, 10, id="60-40-between-keep"),
        pytest.param(70.0, 30.0, 2.0, 0.5, None, None, [90.0, 90.0, 90.0], 10, 20, id="factor-2.0-up"),
        pytest.param(70.0, 30.0, 1.5, 0.5, None, None, [5.0, 5.0, 5.0], 10, 5, id="factor-0.5-down"),
        pytest.param(70.0, 30.0, 1.5, 0.5, None, None, [5.0, 5.0, 5.0], 3, 1, id="factor-0.5-floor-1.5"),
        pytest.param(
            20.0,
            10.0,
            2.0,
            0.8,
            Stickiness(5, 3),
            None,
            [25.0, 30.0, 28.0, 35.0, 22.0],
            10,
            20,
            id="up-sticky-5-3-all-breach",
        ),
        pytest.param(
            20.0,
            10.0,
            2.0,
            0.8,
            Stickiness(5, 3),
            None,
            [25.0, 15.0, 12.0, 18.0, 22.0],
            10,
            10,
            id="up-sticky-5-3-only-2-breach",
        ),
        pytest.param(
            70.0,
            30.0,
            1.2,
            0.5,
            None,
            Stickiness(5, 3),
            [10.0, 15.0, 50.0, 8.0, 12.0],
            10,
            5,
            id="down-sticky-5-3-four-below",
        ),
        pytest.param(
            70.0,
            30.0,
            1.5,
            0.8,
            Stickiness(3, 2),
            Stickiness(3, 2),
            [90.0] * 7 + [15.0, 10.0, 12.0],
            10,
            8,
            id="both-sticky-3-2-last-3-below",
        ),
    ],
)
def test_desired_instances_custom_policy(
    up: float,
    down: float,
    up_factor: float,
    down_factor: float,
    up_sticky: Stickiness | None,
    down_sticky: Stickiness | None,
    samples: list[float],
    current: int,
    expected: int,
) -> None:
    policy = Policy(
        scale_up_threshold=up,
        scale_down_threshold=down,
        scale_up_factor=up_factor,
        scale_down_factor=down_factor,
        scale_up_stickiness=up_sticky,
        scale_down_stickiness=down_sticky,
    )
    assert desired_instances(samples, policy, current, 0.0).desired == expected


# --- §2.7 decide (default policy, decay 0) --------------------------------------------------------------


@pytest.mark.parametrize(
    ("current", "samples", "recently_invoked", "last_predicted", "expected"),
    [
        pytest.param(2, [5.0, 6.0, 4.0], False, 2, Estimate(0, 5.0), id="idle-low-util-to-zero"),
        pytest.param(2, [5.0, 6.0, 4.0], True, 2, Estimate(1, 5.0), id="invoked-low-util-down-to-1"),
        pytest.param(10, [90.0, 90.0, 90.0], False, 10, Estimate(12, 90.0), id="idle-high-util-never-zeroed"),
        pytest.param(0, [], False, 5, None, id="stale-zero-guard-skip"),
        pytest.param(0, [0.0, 0.0, 0.0], False, 0, Estimate(0, 0.0), id="zero-instances-zero-util"),
        pytest.param(
            1,
            sanitize([(0, "NaN"), (1, "NaN"), (2, "NaN")]),
            False,
            1,
            Estimate(0, 0.0),
            id="nan-samples-sanitized-to-zero",
        ),
    ],
)
def test_decide(
    current: int,
    samples: list[float],
    recently_invoked: bool,
    last_predicted: int,
    expected: Estimate | None,
) -> None:
    result = decide(
        samples,
        DEFAULT_POLICY,
        current=current,
        recently_invoked=recently_invoked,
        last_predicted=last_predicted,
        decay=0.0,
    )
    if expected is None:
        assert result is None
    else:
        assert result is not None
        assert result.desired == expected.desired
        assert result.average == pytest.approx(expected.average)


# --- sanitize -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        pytest.param([(1200, "0.70"), (1080, "0.50"), (1140, "0.60")], [0.5, 0.6, 0.7], id="sorted-by-timestamp"),
        pytest.param([(1, "invalid"), (2, "0.60"), (3, "")], [0.0, 0.6, 0.0], id="unparsable-to-zero"),
        pytest.param([(1, "NaN"), (2, "+Inf"), (3, "-Inf")], [0.0, 0.0, 0.0], id="non-finite-to-zero"),
        pytest.param([], [], id="empty"),
    ],
)
def test_sanitize(rows: list[tuple[float, object]], expected: list[float]) -> None:
    assert sanitize(rows) == pytest.approx(expected)


# --- the project's own additions -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("desired", "backlog", "slots", "in_flight", "expected"),
    [
        pytest.param(0, 0, 1, 0, 0, id="nothing-to-do-zero"),
        pytest.param(0, 1, 4, 0, 1, id="one-queued-wakes-one"),
        pytest.param(1, 10, 4, 0, 3, id="backlog-10-over-4-slots-ceil-3"),
        pytest.param(0, 0, 1, 2, 1, id="in-flight-keeps-one"),
        pytest.param(5, 3, 1, 0, 5, id="desired-above-backlog-wins"),
    ],
)
def test_with_backlog(desired: int, backlog: int, slots: int, in_flight: int, expected: int) -> None:
    assert with_backlog(desired, backlog=backlog, slots_per_instance=slots, in_flight=in_flight) == expected


@pytest.mark.parametrize(
    ("total", "limits", "expected"),
    [
        pytest.param(3, [(0, 2), (0, 2)], [2, 1], id="fill-first-then-second"),
        pytest.param(0, [(1, 2), (0, 3)], [1, 0], id="minimums-kept-at-zero-total"),
        pytest.param(10, [(0, 2), (1, 3)], [2, 3], id="capped-at-maximums"),
        pytest.param(1, [(0, 0), (0, 4)], [0, 1], id="skip-spec-with-max-0"),
    ],
)
def test_distribute(total: int, limits: list[tuple[int, int]], expected: list[int]) -> None:
    assert distribute(total, limits) == expected


def test_weighted_average_decay_zero_is_plain_mean() -> None:
    assert weighted_average([1.0, 2.0, 3.0], 0.0) == pytest.approx(2.0)


def test_weighted_average_empty_is_zero() -> None:
    assert weighted_average([], 0.5) == 0.0


@pytest.mark.parametrize("decay", [pytest.param(0.1, id="decay-0.1"), pytest.param(1.0, id="decay-1.0")])
def test_weighted_average_newest_weighs_more(decay: float) -> None:
    samples = [1.0, 2.0, 3.0]
    average = weighted_average(samples, decay)
    assert statistics.fmean(samples) < average < samples[-1]
