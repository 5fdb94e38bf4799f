"""HTTP/2 header blocks written without Huffman coding, in the processes that relay gRPC calls.

h2 encodes every header block with HPACK's Huffman code, which the pure-Python ``hpack`` does a bit
at a time: about 90 us of a worker's 270 us to encode one gRPC call's ~25 headers (the client's
metadata and the ``nvcf-*`` entries of the worker contract, several of them new per call). Plain
literals are as valid HPACK (every decoder reads both) and cost a few dozen bytes more per call,
on loopback or inside a cluster. Header blocks are still indexed in HPACK's dynamic table as before.
"""

from __future__ import annotations

from typing import Any

import hpack

_encode = hpack.Encoder.encode


def _encode_plain(self: hpack.Encoder, headers: Any, huffman: bool = False) -> bytes:
    return _encode(self, headers, huffman=huffman)


def install() -> None:
    """Make h2's header blocks in this process plain literals (idempotent)."""
    hpack.Encoder.encode = _encode_plain  # type: ignore[method-assign]
