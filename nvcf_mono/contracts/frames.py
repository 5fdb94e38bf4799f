"""The invocation hot path's wire format: requests in the request streams and response frames.

Both are ``<4-byte big-endian header length><JSON header><raw body>``: the body is never copied
into another encoding, and the same bytes sit in the stream, cross the bus between invocation
nodes and ride the WorkerService stream as a ``bytes`` field, so relaying never re-encodes them.
(A betterproto message costs ~100 us to decode; this header costs a few.) Keys are short because
every request pays for them.

Response frames of one request are numbered from 0 per delivery attempt; the last one has ``end``
(with the total body length) or a problem. A receiver that sees a gap aborts the response.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import Any

import attrs

from nvcf_mono import compact_json

_LEN = struct.Struct(">I")
Headers = tuple[tuple[str, str], ...]
#: The request header that turns the worker's compatibility mode off for one request (NVCF's).
COMPATIBILITY_OFF = "nvcf-feature-disable-worker-compatibility"


def header_value(headers: Iterable[tuple[str, str]], name: str) -> str | None:
    """The first value of the header ``name`` (given in lower case), its name matched in any case."""
    return next((value for key, value in headers if key.lower() == name), None)


class FrameError(ValueError):
    """Bytes that are not a frame of this format."""


def _pack(header: dict[str, Any], body: bytes | memoryview) -> bytes:
    meta = compact_json.dumps(header)  # on every hop of every request: the fast encoder
    return b"".join((_LEN.pack(len(meta)), meta, body))


def _unpack(blob: bytes) -> tuple[dict[str, Any], bytes]:
    if len(blob) < 4:
        raise FrameError("frame shorter than its length prefix")
    (size,) = _LEN.unpack_from(blob)
    if 4 + size > len(blob):
        raise FrameError("frame header runs past the end")
    meta = blob[4 : 4 + size]
    try:
        header = compact_json.loads(meta)
    except ValueError as err:
        raise FrameError(f"frame header is not JSON: {err}") from err
    if not isinstance(header, dict):
        raise FrameError("frame header is not an object")
    return header, blob[4 + size :]


@attrs.frozen(kw_only=True, slots=True)
class Request:
    """An invocation request, as published to ``rq.<region>.<fvid>.<requestId>``."""

    request_id: str
    nca_id: str
    function_id: str
    function_version_id: str
    method: str
    #: Path and query the inference server is called with.
    path: str
    headers: Headers
    #: Subject of the invocation node that holds the client; frames go there.
    reply: str
    time_ms: int
    #: Queue deadline (epoch ms): not started by then, the request is dropped with a stored 504.
    deadline_ms: int
    poll_seconds: int
    body: bytes = b""
    #: Name in the payload object store when the body was too large to inline.
    body_object: str | None = None
    body_size: int = 0
    function_name: str = ""
    asset_ids: tuple[str, ...] = ()
    client_subject: str = ""
    streaming: bool = False
    grpc: bool = False
    #: A gRPC call whose client had not closed its side: more of its stream follows (contracts/live_input.py).
    live_input: bool = False
    #: The region of the invocation node that accepted it (the function's ``NVCF-INVOCATION-REGION``).
    invocation_region: str = ""

    def encode(self) -> bytes:
        header: dict[str, Any] = {
            "i": self.request_id,
            "n": self.nca_id,
            "f": self.function_id,
            "v": self.function_version_id,
            "m": self.method,
            "p": self.path,
            "h": self.headers,
            "r": self.reply,
            "t": self.time_ms,
            "d": self.deadline_ms,
            "w": self.poll_seconds,
            "z": self.body_size,
        }
        if self.body_object:
            header["o"] = self.body_object
        if self.function_name:
            header["fn"] = self.function_name
        if self.asset_ids:
            header["a"] = self.asset_ids
        if self.client_subject:
            header["c"] = self.client_subject
        if self.streaming:
            header["s"] = 1
        if self.grpc:
            header["g"] = 1
        if self.live_input:
            header["li"] = 1
        if self.invocation_region:
            header["ir"] = self.invocation_region
        return _pack(header, self.body)

    @classmethod
    def decode(cls, blob: bytes) -> Request:
        h, body = _unpack(blob)
        try:
            return cls(
                request_id=h["i"],
                nca_id=h["n"],
                function_id=h["f"],
                function_version_id=h["v"],
                method=h["m"],
                path=h["p"],
                headers=tuple([(str(k), str(v)) for k, v in h["h"]]),
                reply=h["r"],
                time_ms=int(h["t"]),
                deadline_ms=int(h["d"]),
                poll_seconds=int(h["w"]),
                body=bytes(body),
                body_object=h.get("o"),
                body_size=int(h.get("z", len(body))),
                function_name=h.get("fn", ""),
                asset_ids=tuple(h.get("a", ())),
                client_subject=h.get("c", ""),
                streaming=bool(h.get("s")),
                grpc=bool(h.get("g")),
                live_input=bool(h.get("li")),
                invocation_region=str(h.get("ir", "")),
            )
        except (KeyError, TypeError, ValueError) as err:
            raise FrameError(f"not an invocation request: {err}") from err


@attrs.frozen(kw_only=True, slots=True)
class Problem:
    """An error that ends a response (rendered as problem+json by the receiving node)."""

    status: int
    detail: str
    title: str = ""
    type: str = ""


#: The attempt of a frame the platform sends itself: no delivery of the request answered it.
PLATFORM_ATTEMPT = 0


@attrs.frozen(kw_only=True, slots=True)
class Frame:
    """A piece of a response."""

    request_id: str
    seq: int
    attempt: int = 1
    #: Status and headers: only on the first frame of an attempt.
    status: int | None = None
    headers: Headers = ()
    body: bytes = b""
    end: bool = False
    total_length: int | None = None
    problem: Problem | None = None
    #: A progress 202 (the worker's progress file): percent complete.
    percent: int | None = None
    #: gRPC relay: the call's trailers with the end frame.
    trailers: Headers = ()
    #: Only on frames a nats-transport worker sends up its gRPC stream because the request's node
    #: went away: the capability of the request's reply subject, without which they are not kept.
    capability: str = ""
    #: On the first frame of a response from the inference server, as the worker measured it (ms):
    #: from taking the request to sending this frame, and of that the server's time to its head.
    timing: tuple[float, float] | None = None

    @property
    def last(self) -> bool:
        return self.end or self.problem is not None

    def encode(self) -> bytes:
        header: dict[str, Any] = {"i": self.request_id, "s": self.seq}
        if self.attempt != 1:
            header["a"] = self.attempt
        if self.status is not None:
            header["st"] = self.status
            header["h"] = self.headers
        if self.end:
            header["e"] = 1
            header["n"] = self.total_length
        if self.problem is not None:
            header["p"] = [self.problem.status, self.problem.detail, self.problem.title, self.problem.type]
        if self.percent is not None:
            header["pc"] = self.percent
        if self.trailers:
            header["tr"] = self.trailers
        if self.capability:
            header["k"] = self.capability
        if self.timing is not None:
            header["t"] = self.timing
        return _pack(header, self.body)

    @classmethod
    def decode(cls, blob: bytes) -> Frame:
        h, body = _unpack(blob)
        try:
            p = h.get("p")
            return cls(
                request_id=h["i"],
                seq=int(h["s"]),
                attempt=int(h.get("a", 1)),
                status=h.get("st"),
                headers=tuple([(str(k), str(v)) for k, v in h.get("h", ())]),
                body=bytes(body),
                end=bool(h.get("e")),
                total_length=h.get("n"),
                problem=None if p is None else Problem(status=int(p[0]), detail=p[1], title=p[2], type=p[3]),
                percent=h.get("pc"),
                trailers=tuple([(str(k), str(v)) for k, v in h.get("tr", ())]),
                capability=str(h.get("k", "")),
                timing=_timing(h.get("t")),
            )
        except (KeyError, TypeError, ValueError, IndexError) as err:
            raise FrameError(f"not a response frame: {err}") from err


def _timing(value: Any) -> tuple[float, float] | None:
    if value is None:
        return None
    worker, execution = value
    return float(worker), float(execution)


def problem_frame(request_id: str, status: int, detail: str) -> Frame:
    """The platform's own answer to a request: one frame that ends it with a problem."""
    return Frame(request_id=request_id, seq=0, attempt=PLATFORM_ATTEMPT, problem=Problem(status=status, detail=detail))
