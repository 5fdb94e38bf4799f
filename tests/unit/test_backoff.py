"""The worker's reconnection backoff: doubling delays with jitter, capped, reset after a good session."""

from __future__ import annotations

import pytest

from nvcf_mono.backoff import Backoff


def test_delays_double_up_to_the_cap_and_reset() -> None:
    backoff = Backoff(0.2, 10.0, rand=lambda low, high: 1.0)
    assert [backoff.next() for _ in range(8)] == pytest.approx([0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 10.0, 10.0])
    backoff.reset()
    assert backoff.next() == pytest.approx(0.2)


def test_jitter_stays_within_its_bounds() -> None:
    seen = []
    backoff = Backoff(1.0, 1.0, jitter=0.25, rand=lambda low, high: seen.append((low, high)) or high)
    assert backoff.next() == pytest.approx(1.25)
    assert seen == [(0.75, 1.25)]
    real = Backoff(1.0, 1.0, jitter=0.2)
    assert all(0.8 <= real.next() <= 1.2 for _ in range(200))
