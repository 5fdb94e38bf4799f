"""The Prometheus registry and its text exposition."""

from __future__ import annotations

import pytest

from nvcf_mono.metrics import MetricError, Metrics


def test_counter_gauge_and_histogram_exposition() -> None:
    m = Metrics()
    requests = m.counter("requests_total", "Requests.", ["code"])
    requests.inc(code="200")
    requests.inc(2, code="500")
    m.gauge("queue_depth", "Depth.").set(3)
    m.gauge("pending", 'Help with "quotes"\nand a newline.', ["fn"]).set_function(lambda: [(("a\\b",), 1.5)])
    latency = m.histogram("latency_seconds", "Latency.", buckets=(0.1, 1.0))
    for value in (0.05, 0.5, 5.0):
        latency.observe(value)
    text = m.render()
    assert text == (
        "# HELP latency_seconds Latency.\n# TYPE latency_seconds histogram\n"
        'latency_seconds_bucket{le="0.1"} 1\nlatency_seconds_bucket{le="1"} 2\nlatency_seconds_bucket{le="+Inf"} 3\n'
        "latency_seconds_sum 5.55\nlatency_seconds_count 3\n"
        '# HELP pending Help with \\"quotes\\"\\nand a newline.\n# TYPE pending gauge\npending{fn="a\\\\b"} 1.5\n'
        "# HELP queue_depth Depth.\n# TYPE queue_depth gauge\nqueue_depth 3\n"
        "# HELP requests_total Requests.\n# TYPE requests_total counter\n"
        'requests_total{code="200"} 1\nrequests_total{code="500"} 2\n'
    )


def test_redeclaring_returns_the_same_metric_and_shape_conflicts_fail() -> None:
    m = Metrics()
    assert m.counter("x_total", "X.", ["a"]) is m.counter("x_total", "X.", ["a"])
    with pytest.raises(MetricError):
        m.gauge("x_total", "X.", ["a"])
    with pytest.raises(MetricError):
        m.counter("x_total", "X.", ["b"])


def test_wrong_labels_are_an_error() -> None:
    counter = Metrics().counter("y_total", "Y.", ["a"])
    with pytest.raises(MetricError, match=r"takes labels \('a',\)"):
        counter.inc(b="1")


def test_an_unlabelled_counter_shows_zero_before_use() -> None:
    m = Metrics()
    m.counter("z_total", "Z.")
    assert "z_total 0\n" in m.render()
