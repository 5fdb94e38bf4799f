"""Compressed gRPC messages are read, not refused.

A gRPC peer may compress a message when the call's ``grpc-encoding`` header names an algorithm: a
grpcio client made with ``compression=``, or a server set to compress its answers (grpcio's
``grpc.server(compression=...)`` does for every call). grpclib raises ``NotImplementedError`` on
such a message, so a compressing client's call ended in UNKNOWN and a compressing function's answer
broke its worker's session. :func:`install` gives grpclib's clients and servers a reader that inflates
``gzip`` and ``deflate`` messages. The proxy and the worker send every message on uncompressed, which
every gRPC peer must accept, so nothing else changes.

The same reader looks at a message's declared size before reading its bytes (grpclib would buffer
whatever size a peer declares, up to 4 GiB, before the handler sees the message): a server refuses
one larger than :data:`MAX_INFLATED` unless its handler set a guard of its own (:func:`guarded`).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from functools import partial
from typing import Any

import grpclib.client
import grpclib.server
from grpclib.const import Status
from grpclib.exceptions import GRPCError

from nvcf_mono.grpc import request_head

#: The largest message a compressed one may inflate to (what the platform accepts as a whole request
#: by default); past it the call ends with RESOURCE_EXHAUSTED rather than filling memory.
MAX_INFLATED = 64 << 20
ENCODING = "grpc-encoding"
#: zlib's window bits per gRPC encoding: gzip's header, or zlib's (gRPC's "deflate" is zlib-wrapped).
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
_PREFIX = struct.Struct(">BI")
#: Told each message's size, prefix included, before its bytes are read (see :func:`guarded`).
_GUARD: ContextVar[Callable[[int], None] | None] = ContextVar("grpc_message_guard", default=None)


@contextmanager
def guarded(guard: Callable[[int], None]) -> Iterator[None]:
    """Messages a server handler reads in this context, and in tasks started from it, are announced to
    ``guard`` (their size, prefix included) before their bytes are read: it raises to refuse one. The
    server's default bound on a message's size does not apply meanwhile; the guard decides.
    """
    token = _GUARD.set(guard)
    try:
        yield
    finally:
        _GUARD.reset(token)


def inflate(data: bytes, encoding: str | None, *, limit: int = MAX_INFLATED) -> bytes:
    """A compressed message's bytes; a GRPCError says why they cannot be had."""
    wbits = _WBITS.get((encoding or "").strip().lower())
    if wbits is None:
        raise GRPCError(
            Status.UNIMPLEMENTED,
            f"a compressed message with grpc-encoding {encoding!r}: only gzip and deflate are accepted",
        )
    inflater = zlib.decompressobj(wbits)
    try:
        out = inflater.decompress(data, limit)
    except zlib.error as err:
        raise GRPCError(Status.INTERNAL, f"a {encoding} message that does not decompress: {err}") from None
    if inflater.unconsumed_tail:
        raise GRPCError(Status.RESOURCE_EXHAUSTED, f"a compressed message inflates to more than {limit} bytes")
    if not inflater.eof:
        raise GRPCError(Status.INTERNAL, f"a {encoding} message that ends before its compressed data does")
    return out


async def _recv_message(stream: Any, codec: Any, message_type: Any, *, most: int | None = None) -> Any:
    """The message grpclib's ``recv_message`` reads, inflating a compressed message by the stream's ``grpc-encoding``.

    ``stream`` is grpclib's HTTP/2 stream: its ``headers`` are the request's on a server and the
    response's on a client (read before any message; a server's are kept by :mod:`request_head`).
    On a server (``most`` given) a message's declared size is looked at before its bytes are read: the
    handler's guard decides, or, without one, more than ``most`` is refused. A client's reads are not
    guarded (a handler that calls out reads its answers unguarded).
    """
    prefix = await stream.recv_data(_PREFIX.size)
    if not prefix:
        return None
    if len(prefix) != _PREFIX.size:
        raise GRPCError(Status.INTERNAL, "the stream ended inside a message's prefix")
    flag, size = _PREFIX.unpack(prefix)
    if most is not None:  # a server's read: its handler's guard decides, else ``most`` does
        guard = _GUARD.get()
        if guard is not None:
            guard(_PREFIX.size + size)
        elif size > most:
            raise GRPCError(Status.RESOURCE_EXHAUSTED, f"a message of {size} bytes: the most one may be is {most}")
    data = await stream.recv_data(size)
    if len(data) != size:
        raise GRPCError(Status.INTERNAL, f"the stream ended inside a message ({len(data)} of {size} bytes)")
    if flag:
        encoding = next((value for key, value in stream.headers or () if key == ENCODING), None)
        data = inflate(data, encoding)
    return codec.decode(data, message_type)


def install() -> None:
    """Make grpclib's clients and servers in this process read compressed messages (idempotent).

    grpclib's client and server modules call the ``recv_message`` they imported by name; both are
    replaced. The reader is grpclib's own but for the compressed flag and, on a server, a bound on a
    message's declared size. A client's stream holds the response's head; a server keeps the
    request's aside, so its handler is wrapped to put it there.
    """
    grpclib.client.recv_message = _recv_message  # type: ignore[attr-defined]
    grpclib.server.recv_message = partial(_recv_message, most=MAX_INFLATED)  # type: ignore[attr-defined]
    request_head.install()
