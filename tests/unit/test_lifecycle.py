"""The in-flight tracker: what shutdown waits for, counted by kind."""

from __future__ import annotations

import anyio
import pytest

from nvcf_mono.lifecycle import GRPC_STREAM, HTTP_REQUEST, InflightTracker

pytestmark = pytest.mark.anyio


async def test_it_counts_by_kind_and_is_idle_when_all_have_ended() -> None:
    tracker = InflightTracker()
    assert tracker.describe() == "nothing" and tracker.count == 0
    tracker.enter(HTTP_REQUEST)
    tracker.enter(HTTP_REQUEST)
    with tracker.track(GRPC_STREAM):
        assert tracker.describe() == "2 HTTP requests, 1 gRPC stream" and tracker.count == 3
        assert tracker.of(HTTP_REQUEST) == 2 and tracker.of(GRPC_STREAM) == 1
    tracker.exit(HTTP_REQUEST)
    assert tracker.describe() == "1 HTTP request"
    with anyio.move_on_after(0.05) as scope:
        await tracker.wait_idle()
    assert scope.cancelled_caught, "one request is still in flight"
    tracker.exit(HTTP_REQUEST)
    with anyio.fail_after(1):
        await tracker.wait_idle()
    assert tracker.describe() == "nothing" and tracker.count == 0
