"""Compressed gRPC messages: inflated by their encoding, refused with a status that says why."""

from __future__ import annotations

import gzip
import zlib

import pytest
from grpclib.const import Status
from grpclib.exceptions import GRPCError

from nvcf_mono.grpc.compression import inflate

MESSAGE = b"a protobuf message " * 100


@pytest.mark.parametrize(
    ("encoding", "compressed"),
    [
        ("gzip", gzip.compress(MESSAGE, mtime=0)),
        ("deflate", zlib.compress(MESSAGE)),
        (" GZIP ", gzip.compress(MESSAGE, mtime=0)),
    ],
    ids=["gzip", "deflate", "spaced-upper-case"],
)
def test_gzip_and_deflate_messages_inflate(encoding: str, compressed: bytes) -> None:
    assert inflate(compressed, encoding) == MESSAGE


@pytest.mark.parametrize("encoding", ["snappy", "identity", None, ""])
def test_another_encoding_is_unimplemented(encoding: str | None) -> None:
    with pytest.raises(GRPCError) as err:
        inflate(gzip.compress(MESSAGE), encoding)
    assert err.value.status is Status.UNIMPLEMENTED
    assert "only gzip and deflate" in (err.value.message or "")


def test_bytes_that_do_not_decompress_are_an_internal_error() -> None:
    with pytest.raises(GRPCError) as err:
        inflate(b"not gzip at all", "gzip")
    assert err.value.status is Status.INTERNAL


def test_a_message_cut_short_is_an_internal_error() -> None:
    with pytest.raises(GRPCError) as err:
        inflate(gzip.compress(MESSAGE)[:-12], "gzip")
    assert err.value.status is Status.INTERNAL
    assert "ends before" in (err.value.message or "")


def test_a_message_that_inflates_past_the_limit_is_refused_without_inflating_it_all() -> None:
    bomb = gzip.compress(bytes(64 << 20))  # 64 MiB of zeros in about 64 KiB
    with pytest.raises(GRPCError) as err:
        inflate(bomb, "gzip", limit=1 << 20)
    assert err.value.status is Status.RESOURCE_EXHAUSTED
    assert inflate(gzip.compress(bytes(1 << 20)), "gzip", limit=1 << 20) == bytes(1 << 20)
