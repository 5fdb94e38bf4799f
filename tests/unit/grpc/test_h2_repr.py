"""The cheaper repr of HTTP/2 frame payloads says exactly what hyperframe's own said."""

from __future__ import annotations

import hyperframe.frame
import pytest

from nvcf_mono.grpc import h2_repr


@pytest.mark.parametrize("size", [0, 1, 9, 10, 11, 12, 16 * 1024, 1024 * 1024])
def test_the_text_is_unchanged(size: int) -> None:
    data = bytes(range(256)) * (size // 256) + bytes(range(size % 256))
    assert h2_repr._raw_data_repr(data) == h2_repr.original(data)
    assert h2_repr._raw_data_repr(memoryview(data)) == h2_repr.original(data)


def test_it_is_what_h2_calls() -> None:
    assert hyperframe.frame._raw_data_repr is h2_repr._raw_data_repr
    frame = hyperframe.frame.DataFrame(1, data=b"\x00" * 20_000)
    assert repr(frame).endswith(": <hex:" + "00" * 10 + "...>")
