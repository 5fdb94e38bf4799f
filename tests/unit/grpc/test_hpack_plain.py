"""Header blocks written without Huffman coding still decode to the same headers, in any HPACK decoder."""

from __future__ import annotations

import hpack

from nvcf_mono.grpc import hpack_plain


def test_header_blocks_are_plain_literals_that_decode_the_same() -> None:
    headers = [(":path", "/examples.echo.v1.EchoService/Echo"), ("nvcf-reqid", "4c0d9b1e-0b0e-4a4e-9d3c-5f1e2a3b4c5d")]
    # (The install is for the whole process: another test here may have made it already.)
    huffman = hpack.Encoder().encode(headers, huffman=True)
    assert b"nvcf-reqid" not in huffman  # Huffman coded: the name is not there as it is
    hpack_plain.install()
    hpack_plain.install()  # idempotent
    plain = hpack.Encoder().encode(headers)  # what h2 asks for: the encoder's default
    assert b"nvcf-reqid" in plain and b"4c0d9b1e-0b0e-4a4e-9d3c-5f1e2a3b4c5d" in plain
    assert hpack.Decoder().decode(plain) == headers == hpack.Decoder().decode(huffman)
