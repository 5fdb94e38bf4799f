"""Telemetry credentials renewed in place, and sent by the checked session with every request.

The session test sends real requests to an HTTP server on 127.0.0.1 (allowed as an operator's network).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

from nvcf_mono.contracts.egress import parse
from nvcf_mono.contracts.telemetry import targets
from nvcf_mono.egress_requests import checked_session
from nvcf_mono.tracing import Credentials
from nvcf_mono.worker.secrets import renew_credentials
from tests.support.http_thread import QuietHandler, serving

URL = "https://otel.example.com/v1/{}"


def _exports(token: str, *, url: str = URL) -> str:
    signal = {"headers": {"Authorization": f"Bearer {token}"}, "networks": []}
    return json.dumps({s: {"url": url.format(s), **signal} for s in ("traces", "logs")})


def test_only_the_credentials_of_the_same_endpoints_are_renewed() -> None:
    exports = targets(_exports("old"))
    assert renew_credentials(exports, _exports("old")) == []
    assert renew_credentials(exports, _exports("new")) == ["traces", "logs"]
    assert exports["logs"].credentials.current() == {"Authorization": "Bearer new"}
    assert exports["logs"].headers == {"Authorization": "Bearer old"}  # what it started with, unchanged
    # Another endpoint (never, as versions keep theirs), nothing, or something unreadable: kept as they are.
    assert renew_credentials(exports, _exports("other", url="https://elsewhere.example.com/v1/{}")) == []
    assert renew_credentials(exports, None) == []
    assert renew_credentials(exports, '{"traces": 1}') == []
    assert exports["traces"].credentials.current() == {"Authorization": "Bearer new"}


@contextmanager
def _server(seen: list[str]) -> Iterator[str]:
    """A receiver that notes each request's Authorization header; its URL."""

    class Handler(QuietHandler):
        def do_POST(self) -> None:
            seen.append(self.headers.get("Authorization", ""))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

    with serving(Handler) as base:
        yield f"{base}/v1/logs"


def test_the_checked_session_sends_the_current_credentials_over_the_exporters() -> None:
    seen: list[str] = []
    with _server(seen) as url, _server(seen) as elsewhere:
        credentials = Credentials({"Authorization": "Bearer old"}, url)
        with checked_session(parse(["127.0.0.0/8"]), credentials=credentials) as session:
            # As the OpenTelemetry exporter sends: the headers it was made with, on each request.
            made_with = {"authorization": "Bearer old"}
            assert session.post(url, data=b"x", headers=made_with, timeout=5).status_code == 200
            assert credentials.renew({"Authorization": "Bearer new"})
            assert not credentials.renew({"Authorization": "Bearer new"})
            assert session.post(url, data=b"x", headers=made_with, timeout=5).status_code == 200
            # Only to the receiver's origin: another port of the same host gets none of it.
            assert session.post(elsewhere, data=b"x", timeout=5).status_code == 200
    assert seen == ["Bearer old", "Bearer new", ""]
