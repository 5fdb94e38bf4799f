"""NVCF's scaling decision, exactly (reference autoscaler §2), plus the queue-depth rule of the seed.

Pure functions over numbers: no clock, no bus. Up and down decisions look at the newest samples
(through the stickiness gate); only the scale-to-zero test uses the decay-weighted average.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Iterable, Sequence

import attrs


@attrs.frozen
class Stickiness:
    """``required`` of the last ``window`` samples must breach."""

    window: int
    required: int


@attrs.frozen(kw_only=True)
class Policy:
    """Thresholds in percent, factors, and optional stickiness per direction."""

    scale_up_threshold: float = 70.0
    scale_down_threshold: float = 30.0
    scale_up_factor: float = 1.2
    scale_down_factor: float = 0.8
    scale_up_stickiness: Stickiness | None = None
    scale_down_stickiness: Stickiness | None = None


DEFAULT_POLICY = Policy()


@attrs.frozen
class Estimate:
    """What the utilization series asks for, and its weighted average."""

    desired: int
    average: float


def sanitize(rows: Iterable[tuple[float, object]]) -> list[float]:
    """``(timestamp, value)`` rows -> values oldest first; unparsable or non-finite values become 0.

    A 0/0 utilization (no slots) is NaN; left as is it would silently disable the scale-to-zero test.
    """
    values = []
    for _, raw in sorted(rows, key=lambda row: row[0]):
        try:
            value = float(raw)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            value = 0.0
        values.append(value if math.isfinite(value) else 0.0)
    return values


def weighted_average(samples: Sequence[float], decay: float) -> float:
    """Newest samples weigh most: ``w_i = exp(-decay * age_i)``; decay 0 is the plain mean."""
    if not samples:
        return 0.0
    n = len(samples)
    weights = [math.exp(-decay * (n - 1 - i)) for i in range(n)]
    return sum(w * v for w, v in zip(weights, samples, strict=True)) / sum(weights)


def breached_enough(samples: Sequence[float], breaches: Callable[[float], bool], stickiness: Stickiness | None) -> bool:
    """At least ``required`` of the last ``window`` samples breach (default: the newest one does)."""
    window, required = (1, 1) if stickiness is None else (stickiness.window, stickiness.required)
    recent = samples[-window:] if window > 0 else []
    return sum(1 for v in recent if breaches(v)) >= required


def desired_instances(samples: Sequence[float], policy: Policy, current: int, decay: float) -> Estimate:
    """Reference §2.4: multiply up (ceil) or down (floor, never below 1), else keep."""
    if not samples:
        return Estimate(max(current, 1), 0.0)
    average = weighted_average(samples, decay)
    base = max(current, 1)
    if breached_enough(samples, lambda v: v > policy.scale_up_threshold, policy.scale_up_stickiness):
        return Estimate(math.ceil(_times(base, policy.scale_up_factor)), average)
    if breached_enough(samples, lambda v: v < policy.scale_down_threshold, policy.scale_down_stickiness):
        return Estimate(max(math.floor(_times(base, policy.scale_down_factor)), 1), average)
    return Estimate(base, average)


def decide(
    samples: Sequence[float],
    policy: Policy,
    *,
    current: int,
    recently_invoked: bool,
    last_predicted: int,
    decay: float,
) -> Estimate | None:
    """Reference §2.5: None while instances asked for have not reported (the stale-zero guard);
    0 only when not recently invoked and the average is below the down threshold.
    """
    if current == 0 and last_predicted > 0:
        return None
    estimate = desired_instances(samples, policy, current, decay)
    if not recently_invoked and estimate.average < policy.scale_down_threshold:
        return Estimate(0, estimate.average)
    return estimate


def with_backlog(desired: int, *, backlog: int, slots_per_instance: int, in_flight: int) -> int:
    """The seed's rule on top of the reference: enough instances for the queue, never 0 with work."""
    wanted = max(desired, math.ceil(backlog / max(slots_per_instance, 1)))
    if backlog > 0 or in_flight > 0:
        wanted = max(wanted, 1)
    return wanted


def distribute(total: int, limits: Sequence[tuple[int, int]]) -> list[int]:
    """Spread a version's count over its GPU specs (reference §9): each gets its min, the rest fills
    the specs in order up to their max.
    """
    counts = [low for low, _ in limits]
    remaining = total - sum(counts)
    for i, (low, high) in enumerate(limits):
        if remaining <= 0:
            break
        extra = min(remaining, high - low)
        counts[i] += extra
        remaining -= extra
    return counts


def _f32(value: float) -> float:
    return float(struct.unpack("f", struct.pack("f", value))[0])


def _times(count: int, factor: float) -> float:
    """``count * factor`` in f32 as the reference computes it (exact: two f32 multiply exactly in f64,
    then round once). In f64, 10 * f32(1.2) would be 12.0000005 and ceil to 13.
    """
    return _f32(_f32(float(count)) * _f32(factor))
