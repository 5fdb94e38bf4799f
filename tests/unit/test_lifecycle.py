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


def test_reserved_work_counts_from_the_claim_until_it_is_released() -> None:
    tracker = InflightTracker()
    early, dropped = tracker.reserve(), tracker.reserve()
    assert tracker.count == 0, "reserved work is not in flight while the host runs"
    dropped.release()  # its plugin stopped before the host did
    tracker.claim_reserved()  # the host begins to stop
    assert tracker.describe() == "1 plugin job"
    late = tracker.reserve()  # reserved once stopping has begun: counted at once
    assert tracker.count == 2
    early.release()
    early.release()  # twice is once
    late.release()
    assert tracker.count == 0 and tracker.describe() == "nothing"
