"""Request and frame encoding: a round trip keeps every field, odd header text included; garbage is refused."""

from __future__ import annotations

import pytest

from nvcf_mono.contracts.frames import Frame, FrameError, Problem, Request


def _request(headers: tuple[tuple[str, str], ...]) -> Request:
    return Request(
        request_id="r1",
        nca_id="acct",
        function_id="f",
        function_version_id="v",
        method="POST",
        path="/echo?x=1",
        headers=headers,
        reply="rs.node.v.r1",
        time_ms=1,
        deadline_ms=2,
        poll_seconds=3,
        body=b"\x00body",
        asset_ids=("a1",),
        streaming=True,
    )


@pytest.mark.parametrize(
    "headers",
    [
        (("Content-Type", "application/json"), ("X-Note", "héllo ✓")),
        # aiohttp hands undecodable header bytes over as lone surrogates: still encoded, and back the same.
        (("X-Raw", "caf\udce9"),),
    ],
)
def test_a_request_survives_the_round_trip(headers: tuple[tuple[str, str], ...]) -> None:
    request = _request(headers)
    assert Request.decode(request.encode()) == request


def test_a_frame_survives_the_round_trip() -> None:
    frame = Frame(
        request_id="r1",
        seq=2,
        attempt=3,
        status=200,
        headers=(("A", "b"),),
        body=b"data",
        end=True,
        total_length=4,
        trailers=(("grpc-status", "0"),),
    )
    assert Frame.decode(frame.encode()) == frame
    problem = Frame(request_id="r1", seq=0, problem=Problem(status=500, detail="d"))
    assert Frame.decode(problem.encode()) == problem


@pytest.mark.parametrize("blob", [b"", b"\x00\x00\x00\x09{}", b"\x00\x00\x00\x02[]", b"\x00\x00\x00\x03{x}"])
def test_garbage_is_refused(blob: bytes) -> None:
    with pytest.raises(FrameError):
        Frame.decode(blob)
    with pytest.raises(FrameError):
        Request.decode(blob)
