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


def test_forget_drops_every_series_that_carries_the_labels() -> None:
    m = Metrics()
    calls = m.counter("calls_total", "Calls.", ["function_id", "version_id"])
    latency = m.histogram("latency_seconds", "Latency.", ["function_id", "version_id"], buckets=(1.0,))
    errors = m.counter("errors_total", "Errors.", ["code", "function_id"])
    depth = m.gauge("depth", "Depth.", ["version_id"])
    for fn, v in (("f", "v1"), ("f", "v2"), ("g", "v3")):
        calls.inc(function_id=fn, version_id=v)
        latency.observe(0.5, function_id=fn, version_id=v)
        depth.set(1, version_id=v)
    errors.inc(code="500", function_id="f")
    errors.inc(code="500", function_id="g")

    m.forget(version_id="v1")
    assert "v1" not in m.render()
    assert calls.value(function_id="f", version_id="v2") == 1 and depth.value(version_id="v2") == 1
    m.forget(function_id="f")
    assert '"f"' not in m.render()
    assert errors.value(code="500", function_id="g") == 1 and latency.count(function_id="g", version_id="v3") == 1
    with pytest.raises(MetricError, match="no labels"):
        calls.forget(code="500")
