"""What the worker accepts as a workload's telemetry receivers (``NVCF_TELEMETRY_EXPORTS``)."""

from __future__ import annotations

import json

import pytest

from nvcf_mono.contracts.telemetry import exports_problem, proxy_problem, targets
from nvcf_mono.tracing import OtlpTarget

GOOD = {
    "traces": {"url": "https://otel.example.com/v1/traces", "headers": {"Authorization": "Bearer t"}},
    "logs": {"url": "https://otel.example.com/v1/logs", "networks": ["10.0.0.0/8"]},
}


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ("{not json", "must be JSON"),
        ("[]", "must be an object keyed by traces, metrics, logs"),
        ('{"profiles": {"url": "https://x"}}', "must be an object keyed by traces, metrics, logs"),
        ('{"traces": "https://x"}', "traces: must be an object with a url"),
        ('{"metrics": {"headers": {}}}', "metrics: must be an object with a url"),
        ('{"logs": {"url": "https://x", "headers": {"a": 1}}}', "logs: headers must be an object of strings"),
        ('{"logs": {"url": "https://x", "headers": ["a"]}}', "logs: headers must be an object of strings"),
        ('{"logs": {"url": "https://x", "networks": "10.0.0.0/8"}}', "logs: networks must be a list"),
        ('{"logs": {"url": "https://x", "networks": ["10.0.0.0/33"]}}', "logs: networks: '10.0.0.0/33' is not"),
    ],
)
def test_a_malformed_value_is_refused_saying_why(raw: str, problem: str) -> None:
    found = exports_problem(raw)
    assert found is not None and found.startswith(problem), found


def test_each_signal_gets_its_receiver_and_credentials() -> None:
    raw = json.dumps(GOOD)
    assert exports_problem(raw) is None
    # A tenant's receiver: public addresses and the listed networks; none listed is public only.
    assert targets(raw) == {
        "traces": OtlpTarget("https://otel.example.com/v1/traces", {"Authorization": "Bearer t"}, ()),
        "logs": OtlpTarget("https://otel.example.com/v1/logs", {}, ("10.0.0.0/8",)),
    }
    assert targets(None) == {} and targets("") == {}


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("http://proxy.corp:3128", None),
        ("https://user:pw@proxy.corp", None),
        ("socks5://proxy:1080", "is not an HTTP proxy's URL"),
        ("proxy.corp:3128", "is not an HTTP proxy's URL"),
        ("http://proxy:99999", "is not a URL"),
    ],
)
def test_a_telemetry_proxy_is_an_http_proxys_url(value: str, problem: str | None) -> None:
    found = proxy_problem(value)
    assert found is None if problem is None else (found is not None and problem in found), found
