"""A fast codec for the WorkerService ``Serve`` stream, wire-compatible with ``worker.proto``.

Every invocation crosses this stream twice (the request down, a response frame up). betterproto
takes ~100 us to build one message; the two hot shapes, ``NodeMessage{request: Delivery}`` and
``WorkerMessage{frame: bytes}``, are a few lines of protobuf wire format, encoded and decoded here
directly. Every other (rare) message goes through the generated betterproto classes. A test checks
both directions against betterproto.
"""

from __future__ import annotations

from typing import Any, ClassVar, final

import betterproto

from nvcf_mono.proto.gen.nvcf.worker.v1 import Delivery, NodeMessage, WorkerMessage

_LEN, _VARINT = 2, 0

#: The status message (with UNAVAILABLE) of a Serve or ConnectOnce call a stopping invocation node ends or
#: refuses: the worker connects again, to another node, and says so without alarm.
NODE_STOPPING = "this invocation node is stopping: connect to another"


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _key(field: int, wire: int) -> bytes:
    return _varint((field << 3) | wire)


def _length_delimited(field: int, payload: bytes) -> bytes:
    return b"".join((_key(field, _LEN), _varint(len(payload)), payload))


def _fields(data: bytes) -> list[tuple[int, int, Any]]:
    """Top-level fields: (number, wire type, bytes or int); other wire types are not expected here."""
    out: list[tuple[int, int, Any]] = []
    pos = 0
    end = len(data)
    while pos < end:
        key, pos = _read_varint(data, pos)
        field, wire = key >> 3, key & 7
        if wire == _LEN:
            size, pos = _read_varint(data, pos)
            out.append((field, wire, data[pos : pos + size]))
            pos += size
        elif wire == _VARINT:
            value, pos = _read_varint(data, pos)
            out.append((field, wire, value))
        else:
            raise ValueError(f"unexpected wire type {wire} in a Serve message")
    return out


@final
class NodeEnvelope:
    """``NodeMessage``: a request to serve (fast path) or any other kind (betterproto)."""

    __slots__ = ("attempt", "message", "request")
    FIELD_REQUEST: ClassVar[int] = 1

    def __init__(self, *, request: bytes | None = None, attempt: int = 0, message: NodeMessage | None = None) -> None:
        self.request = request
        self.attempt = attempt
        self.message = message

    @property
    def kind(self) -> str:
        if self.request is not None:
            return "request"
        assert self.message is not None
        return betterproto.which_one_of(self.message, "kind")[0]

    def SerializeToString(self) -> bytes:
        if self.request is not None:
            inner = _length_delimited(1, self.request)
            if self.attempt:
                inner += _key(2, _VARINT) + _varint(self.attempt)
            return _length_delimited(self.FIELD_REQUEST, inner)
        assert self.message is not None
        return bytes(self.message)

    @classmethod
    def FromString(cls, data: bytes) -> NodeEnvelope:
        fields = _fields(data)
        if len(fields) == 1 and fields[0][0] == cls.FIELD_REQUEST and fields[0][1] == _LEN:
            request, attempt = b"", 0
            for field, wire, value in _fields(fields[0][2]):
                if field == 1 and wire == _LEN:
                    request = bytes(value)
                elif field == 2 and wire == _VARINT:
                    attempt = value
            return cls(request=request, attempt=attempt)
        return cls(message=NodeMessage().parse(data))

    @classmethod
    def of(cls, message: NodeMessage) -> NodeEnvelope:
        if betterproto.which_one_of(message, "kind")[0] == "request":
            delivery: Delivery = message.request
            return cls(request=delivery.request, attempt=delivery.attempt)
        return cls(message=message)


@final
class WorkerEnvelope:
    """``WorkerMessage``: a response frame, a request held or released (fast paths) or any other kind.

    On the nats transport a worker tells its node of every request it pulls (``held``) and settles
    (``released``): two messages per request beside its frames, so they skip betterproto too.
    """

    __slots__ = ("frame", "held", "message", "released")
    FIELD_FRAME: ClassVar[int] = 2
    FIELD_HELD: ClassVar[int] = 6
    FIELD_RELEASED: ClassVar[int] = 7

    def __init__(
        self,
        *,
        frame: bytes | None = None,
        held: tuple[str, str] | None = None,
        released: str | None = None,
        message: WorkerMessage | None = None,
    ) -> None:
        self.frame = frame
        #: (request id, the delivery's ack subject) of a request the worker pulled itself.
        self.held = held
        #: The id of a request the worker settled.
        self.released = released
        self.message = message

    @property
    def kind(self) -> str:
        if self.frame is not None:
            return "frame"
        if self.held is not None:
            return "held"
        if self.released is not None:
            return "released"
        assert self.message is not None
        return betterproto.which_one_of(self.message, "kind")[0]

    def SerializeToString(self) -> bytes:
        if self.frame is not None:
            return _length_delimited(self.FIELD_FRAME, self.frame)
        if self.held is not None:
            request_id, ack_subject = self.held
            inner = _length_delimited(1, request_id.encode()) + _length_delimited(2, ack_subject.encode())
            return _length_delimited(self.FIELD_HELD, inner)
        if self.released is not None:
            return _length_delimited(self.FIELD_RELEASED, _length_delimited(1, self.released.encode()))
        assert self.message is not None
        return bytes(self.message)

    @classmethod
    def FromString(cls, data: bytes) -> WorkerEnvelope:
        fields = _fields(data)
        if len(fields) == 1 and fields[0][1] == _LEN:
            number, _, payload = fields[0]
            if number == cls.FIELD_FRAME:
                return cls(frame=bytes(payload))
            if number in (cls.FIELD_HELD, cls.FIELD_RELEASED):
                strings = {field: bytes(value).decode() for field, wire, value in _fields(payload) if wire == _LEN}
                if number == cls.FIELD_HELD:
                    return cls(held=(strings.get(1, ""), strings.get(2, "")))
                return cls(released=strings.get(1, ""))
        return cls(message=WorkerMessage().parse(data))
