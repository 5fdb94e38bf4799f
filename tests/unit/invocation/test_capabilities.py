"""Per-request capabilities in reply subjects, and the worker grant built from session claims."""

from __future__ import annotations

import os

import pytest

from nvcf_mono.contracts import permissions, subjects
from nvcf_mono.contracts.frames import Frame
from nvcf_mono.planes.invocation.responses import Capabilities


def test_a_capability_belongs_to_one_request_of_one_version() -> None:
    caps = Capabilities(os.urandom(32))
    mine = caps.of("v1", "r1")
    assert mine == caps.of("v1", "r1")  # any node with the same key computes the same
    assert len({mine, caps.of("v1", "r2"), caps.of("v2", "r1"), Capabilities(os.urandom(32)).of("v1", "r1")}) == 4
    reply = subjects.response_subject("node-1", "r1", mine)
    assert reply.count(".") == 4 and subjects.response_capability(reply) == mine  # one subject token
    assert caps.holds("v1", "r1", mine)
    for wrong in ("", mine[:-1], caps.of("v2", "r1"), "é" * 22, "\udcff"):
        assert not caps.holds("v1", "r1", wrong)


def test_the_capability_of_an_orphaned_frame_survives_its_encoding() -> None:
    frame = Frame(request_id="r1", seq=0, status=200, body=b"x", end=True, capability="abc")
    assert Frame.decode(frame.encode()).capability == "abc"
    assert Frame.decode(Frame(request_id="r1", seq=0).encode()).capability == ""


def test_the_grant_is_the_sessions_own_and_no_wider() -> None:
    inbox = subjects.worker_inbox("s1")
    assert permissions.worker_subscribe("v1", inbox) == (f"{inbox}.>", subjects.cancel_subject("v1"))
    publish = permissions.worker_publish("rq_ncp_v1", "rq_ncp_v1_workers")
    assert publish == (
        "$JS.API.CONSUMER.MSG.NEXT.rq_ncp_v1.rq_ncp_v1_workers",
        "$JS.API.CONSUMER.INFO.rq_ncp_v1.rq_ncp_v1_workers",
        "$JS.ACK.rq_ncp_v1.rq_ncp_v1_workers.>",
        "nvcf.resp.*.*.*",
        "nvcf.input.*.*.*",
    )
    for bad_inbox in ("_INBOX.s1", "_INBOX", f"{subjects.WORKER_INBOX_ROOT}.*", f"{subjects.WORKER_INBOX_ROOT}.a.b"):
        with pytest.raises(permissions.NotGrantable):
            permissions.worker_subscribe("v1", bad_inbox)
    with pytest.raises(permissions.NotGrantable):
        permissions.worker_subscribe(">", inbox)
    for stream, durable in (("*", "d"), ("s", ">"), ("a.b", "d"), ("s", ""), ("s", "d e")):
        with pytest.raises(permissions.NotGrantable):
            permissions.worker_publish(stream, durable)
