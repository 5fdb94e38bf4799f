"""Tracing switched off costs nothing and changes nothing; configured without OpenTelemetry, it says how to fix it."""

from __future__ import annotations

import sys

import pytest

from nvcf_mono import tracing


def test_switched_off_every_call_is_a_no_op_and_headers_pass_unchanged() -> None:
    assert not tracing.enabled()
    headers = [("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"), ("x", "1")]
    assert tracing.extract(headers) is None
    span = tracing.start("serve", parent=None, kind="consumer")
    assert span is None
    tracing.end(span, error="ignored")
    assert tracing.headers_of(span) == []
    assert tracing.replace_context(iter(headers), span) == headers


def test_configured_without_the_sdk_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)  # as if not installed
    with pytest.raises(tracing.TracingUnavailable, match=r"pip install 'nvcf-mono\[otel\]'"):
        tracing.setup([tracing.OtlpTarget.at("http://127.0.0.1:4318", "traces")], "nvcf-mono")
    assert not tracing.enabled()


def test_a_span_replaces_the_callers_context_in_the_headers() -> None:
    tracing.setup(
        [tracing.OtlpTarget.at("http://127.0.0.1:9", "traces")], "nvcf-mono", export_delay=60
    )  # nothing listens: no span is ended
    try:
        parent = tracing.extract({"Traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"})
        span = tracing.start("enqueue", parent=parent, kind="producer")
        assert span is not None
        out = tracing.replace_context([("TraceParent", "00-aa-bb-01"), ("Tracestate", "x=1"), ("x", "1")], span)
        names = [k for k, _ in out]
        assert names.count("traceparent") == 1 and "TraceParent" not in names and "Tracestate" not in names
        value = dict(out)["traceparent"]
        context = span.get_span_context()
        assert value == f"00-4bf92f3577b34da6a3ce929d0e0e4736-{context.span_id:016x}-01"
    finally:
        tracing.shutdown()
    assert not tracing.enabled()
