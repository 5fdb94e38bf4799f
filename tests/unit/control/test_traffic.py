"""The minute buckets behind /v2/nvcf/stats: summed over nodes and versions, an hour kept, percentiles."""

from __future__ import annotations

from nvcf_mono.contracts.load import LATENCY_BOUNDS_MS, LoadReport, VersionLoad
from nvcf_mono.planes.control import traffic
from nvcf_mono.planes.control.traffic import TrafficHistory


def _latency(**ms_counts: int) -> tuple[int, ...]:
    counts = [0] * (len(LATENCY_BOUNDS_MS) + 1)
    for bound, n in ms_counts.items():
        counts[LATENCY_BOUNDS_MS.index(int(bound[1:]))] += n
    return tuple(counts)


def _report(at: float, node: str, *versions: VersionLoad) -> LoadReport:
    return LoadReport(node=node, at=at, interval=1.0, versions=versions)


def _load(fvid: str, invocations: int, errors: int = 0, latency: tuple[int, ...] = ()) -> VersionLoad:
    return VersionLoad(
        function_id="f", function_version_id=fvid, busy_seconds=0, slot_seconds=0,
        invocations=invocations, errors=errors, latency=latency,
    )  # fmt: skip


def test_nodes_and_versions_sum_per_minute_and_an_hour_is_kept() -> None:
    history = TrafficHistory()
    t0 = 1_800_000_000.0  # a minute boundary
    history.record(_report(t0 + 1, "a", _load("v1", 3, 1, _latency(b10=3))))
    history.record(_report(t0 + 30, "b", _load("v1", 2, 0, _latency(b10=2)), _load("v2", 4, 0, _latency(b100=4))))
    history.record(_report(t0 + 61, "a", _load("v1", 1)))
    minutes = history.minutes(["v1"], now=t0 + 90, count=3)
    assert [start for start, _ in minutes] == [t0 - 60, t0, t0 + 60]
    assert [(traffic.invocations(c), traffic.errors(c)) for _, c in minutes] == [(0, 0), (5, 1), (1, 0)]
    both = dict(history.minutes(["v1", "v2"], now=t0 + 90, count=2))
    assert traffic.invocations(both[t0]) == 9
    # An hour later the first minute is gone, and a version with nothing left is forgotten.
    history.record(_report(t0 + 61 * 60, "a", _load("v3", 1)))
    assert traffic.invocations(dict(history.minutes(["v1"], now=t0 + 61 * 60, count=60)).get(t0, [0])) == 0
    assert "v2" not in history._versions


def test_percentiles_interpolate_within_a_bucket() -> None:
    counts = [0, 0, *_latency(b10=50, b25=50)]
    assert traffic.percentile(counts, 0.5) == 10.0  # all of the first half is at most 10 ms
    assert traffic.percentile(counts, 0.95) == 10 + (25 - 10) * 45 / 50
    assert traffic.percentile([0, 0, *([0] * (len(LATENCY_BOUNDS_MS) + 1))], 0.5) is None
    slow = [0, 0, *([0] * len(LATENCY_BOUNDS_MS)), 3]
    assert traffic.percentile(slow, 0.95) == float(LATENCY_BOUNDS_MS[-1])
