"""Relaying gRPC calls without decoding them: a message type that is its own bytes, and gRPC framing.

The invocation plane's gRPC proxy and the worker never parse a function's protobufs: messages
travel as gRPC writes them on the wire (a flag byte, a 4-byte big-endian length, the bytes), and
metadata as header pairs (binary ``-bin`` values base64-encoded, as on the wire).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from typing import Any, final

from grpclib.const import Status
from grpclib.encoding.base import StatusDetailsCodecBase
from grpclib.metadata import decode_bin_value, encode_bin_value

_PREFIX = struct.Struct(">BI")
PREFIX_SIZE = _PREFIX.size
GRPC_CONTENT_TYPE = "application/grpc"
#: Trailers the relay carries as the call's status (not metadata).
STATUS, MESSAGE, DETAILS = "grpc-status", "grpc-message", "grpc-status-details-bin"
Pairs = Sequence[tuple[str, str]]


@final
class RawMessage:
    """A gRPC message kept as its encoded bytes (grpclib's ProtoCodec calls these two methods)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    @classmethod
    def FromString(cls, data: bytes) -> RawMessage:
        return cls(data)

    def SerializeToString(self) -> bytes:
        return self.data


class FramingError(ValueError):
    """Bytes that are not length-prefixed gRPC messages."""


def pack(messages: Iterable[bytes]) -> bytes:
    """Messages in gRPC's length-prefixed framing (uncompressed)."""
    return b"".join(_PREFIX.pack(0, len(m)) + m for m in messages)


def unpack(data: bytes) -> list[bytes]:
    """The messages of a complete length-prefixed sequence."""
    reader = Unpacker()
    messages = reader.feed(data)
    if reader.buffered:
        raise FramingError(f"{reader.buffered} bytes after the last complete message")
    return messages


@final
class Unpacker:
    """Splits a byte stream cut anywhere into complete messages."""

    def __init__(self) -> None:
        self._buf = bytearray()

    @property
    def buffered(self) -> int:
        """Bytes of an incomplete message held back."""
        return len(self._buf)

    def feed(self, data: bytes) -> list[bytes]:
        """The messages that ``data`` completes."""
        if not self._buf and len(data) >= PREFIX_SIZE:
            # The common case (whole messages per piece) without copying into the buffer.
            messages = _split(memoryview(data))
            if messages is not None:
                return messages
        self._buf.extend(data)
        out: list[bytes] = []
        offset = 0
        while len(self._buf) - offset >= PREFIX_SIZE:
            flag, size = _PREFIX.unpack_from(self._buf, offset)
            if flag != 0:
                raise FramingError("compressed gRPC messages are not relayed")
            if len(self._buf) - offset - PREFIX_SIZE < size:
                break
            start = offset + PREFIX_SIZE
            out.append(bytes(self._buf[start : start + size]))
            offset = start + size
        del self._buf[:offset]
        return out


def _split(view: memoryview) -> list[bytes] | None:
    """The messages of ``view`` when it holds whole messages only, else None."""
    out: list[bytes] = []
    offset = 0
    while offset < len(view):
        if len(view) - offset < PREFIX_SIZE:
            return None
        flag, size = _PREFIX.unpack_from(view, offset)
        if flag != 0:
            raise FramingError("compressed gRPC messages are not relayed")
        start = offset + PREFIX_SIZE
        if start + size > len(view):
            return None
        out.append(bytes(view[start : start + size]))
        offset = start + size
    return out


def metadata_to_pairs(metadata: Iterable[tuple[str, str | bytes]], *, drop: frozenset[str] = frozenset()) -> Pairs:
    """Metadata (as grpclib gives it) as header pairs; binary values base64-encoded as on the wire."""
    pairs: list[tuple[str, str]] = []
    for key, value in metadata:
        if key in drop:
            continue
        if isinstance(value, bytes):
            pairs.append((key, encode_bin_value(value).decode("ascii")))
        else:
            pairs.append((key, value))
    return pairs


def pairs_to_metadata(
    pairs: Iterable[tuple[str, str]], *, drop: frozenset[str] = frozenset()
) -> list[tuple[str, str | bytes]]:
    """Header pairs as grpclib metadata; pairs gRPC reserves (``grpc-*``, pseudo and transport headers) are left out."""
    metadata: list[tuple[str, str | bytes]] = []
    for raw_key, value in pairs:
        key = raw_key.lower()
        if key in drop or key in _RESERVED or key.startswith((":", "grpc-")) or not _valid_key(key):
            continue
        if key.endswith("-bin"):
            try:
                metadata.append((key, decode_bin_value(value.encode("ascii"))))
            except (ValueError, UnicodeEncodeError):
                continue
        elif value and value.isascii() and value.isprintable():
            metadata.append((key, value))
    return metadata


_RESERVED = frozenset({"content-type", "te", "user-agent", "content-length", "connection", "transfer-encoding"})
_KEY_CHARS = frozenset("0123456789abcdefghijklmnopqrstuvwxyz_.-")


def _valid_key(key: str) -> bool:
    return bool(key) and all(c in _KEY_CHARS for c in key)


@final
class RawStatusDetails(StatusDetailsCodecBase):
    """``grpc-status-details-bin`` kept as bytes both ways, to relay it as it came."""

    def encode(self, status: Status, message: str | None, details: Any) -> bytes:
        return bytes(details)

    def decode(self, status: Status, message: str | None, data: bytes) -> Any:
        return data


def encode_status(status: Status, message: str | None) -> bytes:
    """A ``google.rpc.Status`` with no details, encoded by hand (googleapis' protos are not a dependency)."""
    text = (message or "").encode()
    return b"\x08" + _varint(status.value) + (b"\x12" + _varint(len(text)) + text if text else b"")


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)
