"""gRPC echo function: ``python -m nvcf_mono.examples.grpc_echo --port 8001``.

Serves ``examples.echo.v1.EchoService`` (``nvcf_mono/proto/examples/echo/v1/echo.proto``): unary
``Echo`` answers ``message`` repeated ``repeats`` times after ``delay_seconds``, or ends the call with
``status_code``; server-streaming ``EchoStream`` answers ``repeats`` messages, ``delay_seconds`` apart;
bidirectional ``Converse`` answers each message as it arrives; client-streaming ``Collect`` answers
once, with every message joined.
Every answer carries the metadata the call arrived with. ``grpc.health.v1`` says SERVING.
The tests run it too, with ``--test-hooks``: only then does it honour ``cancelled_path`` and
``gate_path`` (files a caller names; see the proto), never as the catalog starts it.

Register it with ``inferenceUrl: /grpc``, ``inferencePort: 8001``, ``containerImage: grpc-echo`` and
``health: {protocol: gRPC, port: 8001}``; clients call the platform's gRPC port with the metadata
``authorization: Bearer <api key>`` and ``function-id: <fid>``.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, final

import anyio
from grpclib.const import Cardinality, Handler, Status
from grpclib.exceptions import GRPCError
from grpclib.metadata import encode_bin_value
from grpclib.server import Server, Stream
from grpclib.utils import graceful_exit

from nvcf_mono.examples import arguments
from nvcf_mono.grpc import compression
from nvcf_mono.grpc.raw import RawStatusDetails, encode_status
from nvcf_mono.proto.gen.examples.echo.v1 import EchoRequest, EchoResponse, EchoStreamRequest
from nvcf_mono.proto.gen.grpc.health.v1 import (
    HealthBase,
    HealthCheckRequest,
    HealthCheckResponse,
    HealthCheckResponseServingStatus,
)

SERVICE = "examples.echo.v1.EchoService"
MAX_REPEATS = 10_000
MAX_DELAY = 600.0


def _check(repeats: int, delay: float) -> None:
    if not 0 <= repeats <= MAX_REPEATS:
        raise GRPCError(Status.INVALID_ARGUMENT, f"repeats must be from 0 to {MAX_REPEATS}")
    if not 0 <= delay <= MAX_DELAY:
        raise GRPCError(Status.INVALID_ARGUMENT, f"delay_seconds must be from 0 to {MAX_DELAY:g}")


def _metadata(stream: Stream[Any, Any]) -> dict[str, str]:
    """The call's metadata, binary values base64-encoded as on the wire."""
    out: dict[str, str] = {}
    for key, value in (stream.metadata or {}).items():
        out[key] = encode_bin_value(value).decode("ascii") if isinstance(value, bytes) else value
    return out


@final
class EchoService:
    """The echo service, on grpclib streams directly (the answers need the call's metadata).

    ``test_hooks``: honour the requests' file hooks (the tests' way to see cancellation and pacing).
    """

    def __init__(self, *, test_hooks: bool = False) -> None:
        self.test_hooks = test_hooks

    async def echo(self, stream: Stream[EchoRequest, EchoResponse]) -> None:
        """The message, ``repeats`` times (once when 0, proto3's unset), or the status asked for."""
        request = await stream.recv_message()
        if request is None:
            raise GRPCError(Status.INVALID_ARGUMENT, "no request message")
        _check(request.repeats, request.delay_seconds)
        if request.delay_seconds:
            try:
                await asyncio.sleep(request.delay_seconds)
            except asyncio.CancelledError:
                if request.cancelled_path and self.test_hooks:
                    Path(request.cancelled_path).touch()  # noqa: ASYNC240 - no await while being cancelled
                raise
        if request.status_code:
            try:
                status = Status(request.status_code)
            except ValueError:
                detail = f"status_code {request.status_code} is no gRPC status"
                raise GRPCError(Status.INVALID_ARGUMENT, detail) from None
            raise GRPCError(status, request.message, encode_status(status, request.message))
        message = request.message * max(request.repeats, 1)
        await stream.send_message(EchoResponse(message=message, metadata=_metadata(stream)))

    async def echo_stream(self, stream: Stream[EchoStreamRequest, EchoResponse]) -> None:
        """``repeats`` messages, one at a time."""
        request = await stream.recv_message()
        if request is None:
            raise GRPCError(Status.INVALID_ARGUMENT, "no request message")
        _check(request.repeats, request.delay_seconds)
        metadata = _metadata(stream)
        for index in range(max(request.repeats, 1)):
            if index and request.gate_path and self.test_hooks:
                await _until_exists(anyio.Path(f"{request.gate_path}.{index}"))
            if index and request.delay_seconds:
                await asyncio.sleep(request.delay_seconds)
            await stream.send_message(EchoResponse(message=request.message, index=index, metadata=metadata))

    async def converse(self, stream: Stream[EchoRequest, EchoResponse]) -> None:
        """Each message back as it arrives, ``repeats`` times joined, numbered by ``index``."""
        metadata = _metadata(stream)
        index = 0
        while (request := await stream.recv_message()) is not None:
            _check(request.repeats, request.delay_seconds)
            if request.delay_seconds:
                await asyncio.sleep(request.delay_seconds)
            message = request.message * max(request.repeats, 1)
            await stream.send_message(EchoResponse(message=message, index=index, metadata=metadata))
            index += 1

    async def collect(self, stream: Stream[EchoRequest, EchoResponse]) -> None:
        """One answer after the client's last message: the messages joined with spaces, and their count."""
        words = [request.message async for request in stream]
        await stream.send_message(EchoResponse(message=" ".join(words), index=len(words), metadata=_metadata(stream)))

    def __mapping__(self) -> dict[str, Handler]:
        return {
            f"/{SERVICE}/Echo": Handler(self.echo, Cardinality.UNARY_UNARY, EchoRequest, EchoResponse),
            f"/{SERVICE}/EchoStream": Handler(
                self.echo_stream, Cardinality.UNARY_STREAM, EchoStreamRequest, EchoResponse
            ),
            f"/{SERVICE}/Converse": Handler(self.converse, Cardinality.STREAM_STREAM, EchoRequest, EchoResponse),
            f"/{SERVICE}/Collect": Handler(self.collect, Cardinality.STREAM_UNARY, EchoRequest, EchoResponse),
        }


async def _until_exists(path: anyio.Path) -> None:
    while not await path.exists():  # noqa: ASYNC110 - a file appearing has no event to wait on
        await asyncio.sleep(0.01)


@final
class Health(HealthBase):
    """SERVING for the whole server and for the echo service."""

    async def check(self, health_check_request: HealthCheckRequest) -> HealthCheckResponse:
        """SERVING, or NOT_FOUND for a service this server does not have."""
        if health_check_request.service not in ("", SERVICE):
            raise GRPCError(Status.NOT_FOUND, f"unknown service {health_check_request.service!r}")
        return HealthCheckResponse(status=HealthCheckResponseServingStatus(HealthCheckResponseServingStatus.SERVING))

    async def watch(self, health_check_request: HealthCheckRequest) -> AsyncIterator[HealthCheckResponse]:
        """The status once; it never changes."""
        yield await self.check(health_check_request)
        await asyncio.Event().wait()


def make_server(*, test_hooks: bool = False) -> Server:
    """The echo and health services on a grpclib server (not started) that reads compressed requests too."""
    compression.install()
    # Status details as google.rpc.Status bytes, as servers with googleapis' protos send them.
    return Server([EchoService(test_hooks=test_hooks), Health()], status_details_codec=RawStatusDetails())


async def serve(host: str, port: int, *, test_hooks: bool = False) -> None:
    """Serve until SIGTERM or SIGINT."""
    server = make_server(test_hooks=test_hooks)
    with graceful_exit([server], signals=(signal.SIGINT, signal.SIGTERM)):
        await server.start(host, port, reuse_address=True)
        await server.wait_closed()


def main() -> None:
    """Serve until interrupted."""
    parser = arguments(__doc__, port=8001)
    parser.add_argument("--test-hooks", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    asyncio.run(serve(args.host, args.port, test_hooks=args.test_hooks))


if __name__ == "__main__":
    main()
