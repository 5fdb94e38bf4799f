"""A delivery's numbers come from its ack subject, read by the platform itself (not nats-py's metadata)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from nats.aio.msg import Msg

from nvcf_mono.bus.errors import BusError
from nvcf_mono.bus.jetstream import _ack_fields

STAMP = 1_733_400_000_123_456_789

SUBJECTS = [
    f"$JS.ACK.RQ_us-east_abc.w-1.1.12345.12340.{STAMP}.3",  # the form nats-server sends without a domain
    f"$JS.ACK._.ACCOUNTHASH.RQ.w-1.2.5.6.{STAMP}.0.r4nd0m",  # the newer form: domain '_' (none), account hash
    f"$JS.ACK.hub.ACCOUNTHASH.RQ.w-1.7.8.9.{STAMP}.11",  # a domain, without the trailing token
]


@pytest.mark.parametrize("reply", SUBJECTS)
def test_the_same_numbers_as_nats_py_reads(reply: str) -> None:
    meta = Msg(None, subject="rq.x", reply=reply).metadata  # type: ignore[arg-type]
    delivered, stream_seq, consumer_seq, stamp, pending = _ack_fields(reply)
    assert (delivered, stream_seq, consumer_seq, pending) == (
        meta.num_delivered,
        meta.sequence.stream,
        meta.sequence.consumer,
        meta.num_pending,
    )
    assert stamp == STAMP
    assert abs(datetime.fromtimestamp(stamp / 1e9, UTC) - meta.timestamp).total_seconds() < 1e-5


@pytest.mark.parametrize(
    "reply",
    ["", "rq.reply", "$JS.ACK.a.b.1.2.3", "$JS.ACK.a.b.one.2.3.4.5", "$JS.NAK.a.b.1.2.3.4.5", "_INBOX.a.b.1.2.3.4.5.6"],
)
def test_a_subject_that_is_no_ack_subject_is_refused(reply: str) -> None:
    with pytest.raises(BusError, match="not a JetStream delivery"):
        _ack_fields(reply)
