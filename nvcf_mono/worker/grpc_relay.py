"""gRPC functions (``inferenceUrl: /grpc``): relayed calls to the inference server, and its gRPC health check.

The call is made with the client's method path and metadata (plus the ``nvcf-*`` metadata of the
worker contract) on a channel to ``127.0.0.1:INFERENCE_PORT``; messages are never decoded. The
reply becomes frames: the first with status 200 and the response metadata, one frame per reply
message (length-prefixed as on the wire, split if larger than a frame) sent as it arrives, and an
end frame with the trailers (``grpc-status``, ``grpc-message``, details, trailing metadata). A live
call (``Request.live_input``) sends the client's later messages as they are fetched, while its
answer comes back.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import AsyncIterable, Awaitable, Callable
from typing import final

import anyio
from grpclib.client import Channel, Stream
from grpclib.const import Cardinality, Status
from grpclib.exceptions import GRPCError, ProtocolError, StreamTerminatedError
from grpclib.metadata import encode_bin_value

from nvcf_mono.contracts import live_input
from nvcf_mono.contracts.frames import Frame, Headers, Request, header_value
from nvcf_mono.contracts.problems import WORKER_SERVICE
from nvcf_mono.grpc import compression, hpack_plain
from nvcf_mono.grpc.raw import (
    DETAILS,
    GRPC_CONTENT_TYPE,
    MESSAGE,
    STATUS,
    FramingError,
    RawMessage,
    RawStatusDetails,
    Unpacker,
    metadata_to_pairs,
    pack,
    pairs_to_metadata,
    unpack,
)
from nvcf_mono.proto.gen.grpc.health.v1 import HealthCheckRequest, HealthCheckResponseServingStatus, HealthStub
from nvcf_mono.worker.config import WorkerConfig
from nvcf_mono.worker.inference import (
    InferenceCrashed,
    InferenceUnreachable,
    problem_frame,
    request_headers,
)

log = logging.getLogger("nvcf_mono.worker")
#: Set by the proxy when the client gave a deadline; the worker turns it into the call's timeout.
TIMEOUT_HEADER = "grpc-timeout"


# One channel (HTTP/2 connection) per inference server and event loop, reused by every call.
_channels: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[str, int], Channel]] = (
    weakref.WeakKeyDictionary()
)


def _channel(host: str, port: int) -> Channel:
    per_loop = _channels.setdefault(asyncio.get_running_loop(), {})
    channel = per_loop.get((host, port))
    if channel is None:
        compression.install()  # a server may compress its answers
        hpack_plain.install()  # each call's ~25 headers: Huffman coding them was a third of their cost
        channel = per_loop[(host, port)] = Channel(host, port, status_details_codec=RawStatusDetails())
    return channel


def _metadata(config: WorkerConfig, request: Request) -> list[tuple[str, str | bytes]]:
    """The client's metadata and the worker contract's ``nvcf-*`` entries (lowercase, as gRPC wants)."""
    headers = request_headers(
        config,
        request,
        asset_dir=f"{config.inference_asset_dir}/{request.request_id}",
        output_dir=f"{config.inference_response_dir}/{request.request_id}",
    )
    return pairs_to_metadata((k.lower(), v) for k, v in headers.items())


def _timeout(request: Request) -> float | None:
    """What is left of the client's deadline (None: it gave none)."""
    if header_value(request.headers, TIMEOUT_HEADER) is None:
        return None
    return max(request.deadline_ms / 1000 - time.time(), 0.001)


@final
class _Frames:
    """The reply's frames: the first with status 200 and the response head, each message split to fit."""

    def __init__(self, request_id: str, attempt: int, frame_size: int) -> None:
        self.request_id, self.attempt, self.frame_size = request_id, attempt, frame_size
        self.head: Headers = (("content-type", GRPC_CONTENT_TYPE),)
        self.seq = self.total = 0

    def _next(self, body: bytes = b"", trailers: Headers | None = None) -> Frame:
        first, last = self.seq == 0, trailers is not None
        self.total += len(body)
        frame = Frame(
            request_id=self.request_id,
            seq=self.seq,
            attempt=self.attempt,
            status=200 if first else None,
            headers=self.head if first else (),
            body=body,
            end=last,
            total_length=self.total if last else None,
            trailers=trailers or (),
        )
        self.seq += 1
        return frame

    def message(self, data: bytes) -> list[Frame]:
        packed = pack([data])
        return [self._next(packed[at : at + self.frame_size]) for at in range(0, len(packed), self.frame_size)]

    def end(self, trailers: Headers) -> Frame:
        return self._next(trailers=trailers)


#: Asks for a live call's client stream from an offset: a live input answer (contracts/live_input.py).
MoreInput = Callable[[int], Awaitable[bytes]]


async def grpc_call(
    config: WorkerConfig,
    request: Request,
    body: bytes | AsyncIterable[bytes],
    *,
    attempt: int,
    answer: Callable[[Frame], Awaitable[None]],
    more: MoreInput | None = None,
) -> None:
    """Relay one gRPC call to the inference server; its frames go to ``answer``.

    With ``more`` (a live call) the client's later messages are asked for and sent on while the
    answer comes back. Raises :class:`InferenceUnreachable` when the server does not accept the
    connection (nothing was sent), :class:`InferenceCrashed` when the connection breaks during the call.
    """
    rid = request.request_id
    data = body if isinstance(body, bytes) else b"".join([chunk async for chunk in body])
    try:
        messages = unpack(data)
    except FramingError as err:
        await answer(problem_frame(rid, attempt, 400, f"the relayed request is not gRPC: {err}", source=WORKER_SERVICE))
        return
    channel = _channel(config.inference_host, config.inference_port)
    frames = _Frames(rid, attempt, config.frame_size)
    ended = _Ending()
    try:
        async with channel.request(
            request.path,
            Cardinality.STREAM_STREAM,
            RawMessage,
            RawMessage,
            timeout=_timeout(request),
            metadata=_metadata(config, request),
        ) as stream:
            await _send_all(stream, messages, end=more is None)
            failure: Exception | None = None  # stays None when the client's leaving cancelled the call
            if more is None:
                failure = await _receive(stream, frames, answer, ended)
            else:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(_send_live, stream, more, ended, tg.cancel_scope)
                    failure = await _receive(stream, frames, answer, ended)
                    tg.cancel_scope.cancel()  # the answer ended: the client's later messages are not wanted
            if failure is not None:
                raise failure
    except _HeadOnly:
        ended.trailing = list(metadata_to_pairs((stream.trailing_metadata or {}).items()))
    except TimeoutError:
        ended.status, ended.message = Status.DEADLINE_EXCEEDED, "the call's deadline passed in the function"
    except (StreamTerminatedError, ConnectionResetError, BrokenPipeError) as err:
        raise InferenceCrashed(f"the gRPC call to the inference server broke: {type(err).__name__}: {err}") from err
    except OSError as err:
        raise InferenceUnreachable(
            f"cannot connect to the inference server at {config.inference_host}:{config.inference_port}: {err}"
        ) from err
    except ProtocolError as err:
        # Ends the call like a status of the function's (also after messages were relayed).
        log.warning("request %s: gRPC protocol error from the inference server: %s", rid, err)
        ended.status, ended.message = Status.INTERNAL, f"the inference server broke the gRPC protocol: {err}"
    if ended.client_gone:
        ended.status, ended.message = Status.CANCELLED, "the caller's side of the call went away"
    await answer(frames.end((*_status_trailers(ended.status, ended.message, ended.details), *ended.trailing)))


@final
class _Ending:
    """How the call ended: its status, details and trailing metadata, or that the client went away."""

    def __init__(self) -> None:
        self.status: Status = Status.OK
        self.message: str | None = None
        self.details: object = None
        self.trailing: list[tuple[str, str]] = []
        self.client_gone = False


async def _receive(
    stream: Stream[RawMessage, RawMessage], frames: _Frames, answer: Callable[[Frame], Awaitable[None]], ended: _Ending
) -> Exception | None:
    """The server's answer to ``answer``, its end into ``ended``; what ended it badly is returned, not
    raised, so that it leaves the task group of a live call as itself.
    """
    head_taken = False
    try:
        try:
            await stream.recv_initial_metadata()
            head_taken = True
            frames.head = (*frames.head, *metadata_to_pairs((stream.initial_metadata or {}).items()))
            while (reply := await stream.recv_message()) is not None:
                for frame in frames.message(reply.data):
                    await answer(frame)
            await stream.recv_trailing_metadata()
        except GRPCError as err:
            ended.status, ended.message, ended.details = err.status, err.message, err.details
            if not head_taken:
                # Ended with the head: leave at once, not waiting for trailers the answer will not send.
                ended.status, ended.message, ended.details = _status_of_head(stream, err)
                return _HeadOnly()
        ended.trailing = list(metadata_to_pairs((stream.trailing_metadata or {}).items()))
    except Exception as err:
        return err
    return None


async def _send_live(
    stream: Stream[RawMessage, RawMessage], more: MoreInput, ended: _Ending, call: anyio.CancelScope
) -> None:
    """A live call's later messages, as the client sends them, then the end of the request side."""
    offset = 0
    unpacker = Unpacker()
    try:
        while True:
            kind, data = live_input.read_answer(await more(offset))
            if kind == "G":
                ended.client_gone = True
                call.cancel()
                return
            offset += len(data)
            for message in unpacker.feed(data):
                await stream.send_message(RawMessage(message))
            if kind == "E":
                await stream.end()
                return
    except (
        FramingError,
        GRPCError,
        StreamTerminatedError,
        ProtocolError,
        OSError,
        anyio.BrokenResourceError,
        anyio.ClosedResourceError,
    ) as err:
        # The call broke (its receiving side says how), the input was not gRPC, or the session to the
        # node ended (its requests end with it): nothing more is sent.
        log.debug("sending the client's later messages stopped: %s", err)


class _HeadOnly(Exception):
    """The inference server ended the call with its response head (a trailers-only answer)."""


def _status_of_head(stream: Stream[RawMessage, RawMessage], err: GRPCError) -> tuple[Status, str | None, object]:
    """The status a trailers-only answer carries, else grpclib's reading of the head.

    grpclib refuses a trailers-only answer without ``content-type`` (its own servers answer an unknown
    method so) with UNKNOWN "Missing content-type header", and would then wait for trailers until the
    deadline; other clients, and so the caller calling the function directly, get the status in it
    (UNIMPLEMENTED). grpclib keeps the head only on its internal stream.
    """
    fields = dict(getattr(getattr(stream, "_stream", None), "headers", None) or ())
    if fields.get(":status") != "200" or STATUS not in fields:
        return err.status, err.message, err.details
    try:
        return stream._process_grpc_status(fields)  # the same reading grpclib gives trailers
    except GRPCError as bad:
        return bad.status, bad.message, bad.details


async def _send_all(stream: Stream[RawMessage, RawMessage], messages: list[bytes], *, end: bool) -> None:
    """The client's messages, the last one ending the request side when ``end`` (no message: the head)."""
    if not messages:
        await stream.send_request(end=end)
    for i, msg in enumerate(messages):
        await stream.send_message(RawMessage(msg), end=end and i == len(messages) - 1)


def _status_trailers(status: Status, message: str | None, details: object) -> list[tuple[str, str]]:
    """``grpc-status``, ``grpc-message`` and ``grpc-status-details-bin`` of how the call ended."""
    trailers = [(STATUS, str(status.value))]
    if message:
        trailers.append((MESSAGE, message))
    if isinstance(details, bytes) and details:
        trailers.append((DETAILS, encode_bin_value(details).decode("ascii")))
    return trailers


async def check_grpc_health(config: WorkerConfig) -> tuple[bool, str]:
    """grpc.health.v1 Check of the inference server: (healthy, why not).

    The service checked is ``INFERENCE_HEALTH_ENDPOINT`` unless that is an HTTP path (the default),
    then ``""``: the whole server.
    """
    service = "" if config.health_endpoint.startswith("/") else config.health_endpoint
    where = f"grpc.health.v1 Check of {service!r} at {config.inference_host}:{config.health_port}"
    try:
        reply = await HealthStub(_channel(config.inference_host, config.health_port)).check(
            HealthCheckRequest(service=service), timeout=config.health_timeout
        )
    except GRPCError as err:
        return False, f"{where}: {err.status.name} {err.message or ''}".rstrip()
    except (OSError, TimeoutError, StreamTerminatedError, ProtocolError) as err:
        return False, f"{where}: {type(err).__name__}: {err}"
    if reply.status == HealthCheckResponseServingStatus.SERVING:
        return True, ""
    return False, f"{where}: {HealthCheckResponseServingStatus(reply.status).name}"
