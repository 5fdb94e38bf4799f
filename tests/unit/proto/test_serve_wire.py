"""The Serve stream's fast codec reads and writes exactly what betterproto does."""

from __future__ import annotations

import os

import pytest

from nvcf_mono.proto.gen.nvcf.worker.v1 import (
    Cancel,
    Delivery,
    NodeMessage,
    RequestFailed,
    RequestHeld,
    RequestReleased,
    SessionInfo,
    WorkerHello,
    WorkerMessage,
    WorkerStatus,
)
from nvcf_mono.proto.serve_wire import NodeEnvelope, WorkerEnvelope


@pytest.mark.parametrize("size", [0, 1, 127, 128, 300, 16_384, 1_000_000])
@pytest.mark.parametrize("attempt", [0, 1, 3, 300])
def test_requests_round_trip_both_ways(size: int, attempt: int) -> None:
    blob = os.urandom(size)
    reference = bytes(NodeMessage(request=Delivery(request=blob, attempt=attempt)))
    fast = NodeEnvelope(request=blob, attempt=attempt).SerializeToString()
    assert NodeMessage().parse(fast).request == Delivery(request=blob, attempt=attempt)
    decoded = NodeEnvelope.FromString(reference)
    assert (decoded.request, decoded.attempt, decoded.kind) == (blob, attempt, "request")


@pytest.mark.parametrize("size", [0, 1, 128, 70_000])
def test_frames_round_trip_both_ways(size: int) -> None:
    blob = os.urandom(size)
    assert WorkerMessage().parse(WorkerEnvelope(frame=blob).SerializeToString()).frame == blob
    decoded = WorkerEnvelope.FromString(bytes(WorkerMessage(frame=blob)))
    assert (decoded.frame, decoded.kind) == (blob, "frame")


@pytest.mark.parametrize(
    ("request_id", "ack_subject"),
    [
        ("0b6f2c1e-2a4d-4c4e-9d0e-5b1f3f8a9c7d", "$JS.ACK.REQ_local_v.REQ_local_v.1.42.42.1765000000000000000.0"),
        ("r", ""),  # proto3 leaves an empty string out: the fast decoder reads it back as ""
        ("", ""),
        ("é" * 100, "x" * 300),  # lengths over 127 bytes need two-byte varints
    ],
)
def test_held_and_released_round_trip_both_ways(request_id: str, ack_subject: str) -> None:
    held = RequestHeld(request_id=request_id, ack_subject=ack_subject)
    assert WorkerMessage().parse(WorkerEnvelope(held=(request_id, ack_subject)).SerializeToString()).held == held
    decoded = WorkerEnvelope.FromString(bytes(WorkerMessage(held=held)))
    assert (decoded.held, decoded.kind, decoded.message) == ((request_id, ack_subject), "held", None)

    released = RequestReleased(request_id=request_id)
    assert WorkerMessage().parse(WorkerEnvelope(released=request_id).SerializeToString()).released == released
    decoded = WorkerEnvelope.FromString(bytes(WorkerMessage(released=released)))
    assert (decoded.released, decoded.kind, decoded.message) == (request_id, "released", None)


@pytest.mark.parametrize(
    "message",
    [
        NodeMessage(cancel=Cancel(request_id="r", reason="gone")),
        NodeMessage(session=SessionInfo(session_id="s", max_concurrency=4)),
    ],
)
def test_other_node_messages_go_through_betterproto(message: NodeMessage) -> None:
    decoded = NodeEnvelope.FromString(bytes(message))
    assert decoded.request is None and decoded.message == message
    assert NodeEnvelope(message=message).SerializeToString() == bytes(message)


@pytest.mark.parametrize(
    "message",
    [
        WorkerMessage(hello=WorkerHello(session_token="t", instance_id="i", max_concurrency=2)),
        WorkerMessage(status=WorkerStatus(ready=True, in_flight=3, max_concurrency=4, detail="x")),
        WorkerMessage(failed=RequestFailed(request_id="r", reason="crashed")),
    ],
)
def test_other_worker_messages_go_through_betterproto(message: WorkerMessage) -> None:
    decoded = WorkerEnvelope.FromString(bytes(message))
    assert decoded.frame is None and decoded.message == message
    assert decoded.kind in ("hello", "status", "failed")
