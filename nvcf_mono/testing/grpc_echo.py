"""A gRPC inference server for tests and examples: ``python -m nvcf_mono.testing.grpc_echo --port P``.

Serves ``examples.echo.v1.EchoService`` (``proto/examples/echo/v1/echo.proto``): unary ``Echo``
and server-streaming ``EchoStream``, each answer carrying the metadata the call arrived with, and
``grpc.health.v1`` (SERVING for ``""`` and the echo service). Deploy it as a function with
``inferenceUrl: /grpc``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
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

from nvcf_mono.grpc.raw import RawStatusDetails, encode_status
from nvcf_mono.proto.gen.examples.echo.v1 import EchoRequest, EchoResponse, EchoStreamRequest
from nvcf_mono.proto.gen.grpc.health.v1 import (
    HealthBase,
    HealthCheckRequest,
    HealthCheckResponse,
    HealthCheckResponseServingStatus,
)

SERVICE = "examples.echo.v1.EchoService"


def _metadata(stream: Stream[Any, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in (stream.metadata or {}).items():
        out[key] = encode_bin_value(value).decode("ascii") if isinstance(value, bytes) else value
    return out


@final
class EchoService:
    """The echo service, on grpclib streams directly (the answers need the call's metadata)."""

    async def echo(self, stream: Stream[EchoRequest, EchoResponse]) -> None:
        request = await stream.recv_message()
        assert request is not None
        if request.delay_seconds:
            try:
                await asyncio.sleep(request.delay_seconds)
            except asyncio.CancelledError:
                if request.cancelled_path:
                    Path(request.cancelled_path).touch()  # noqa: ASYNC240 - no await while being cancelled
                raise
        if request.status_code:
            status = Status(request.status_code)
            raise GRPCError(status, request.message, encode_status(status, request.message))
        message = request.message * max(request.repeats, 1)
        await stream.send_message(EchoResponse(message=message, metadata=_metadata(stream)))

    async def echo_stream(self, stream: Stream[EchoStreamRequest, EchoResponse]) -> None:
        request = await stream.recv_message()
        assert request is not None
        metadata = _metadata(stream)
        for index in range(max(request.repeats, 1)):
            if index and request.gate_path:
                await _until_exists(anyio.Path(f"{request.gate_path}.{index}"))
            if request.delay_seconds:
                await asyncio.sleep(request.delay_seconds)
            await stream.send_message(EchoResponse(message=request.message, index=index, metadata=metadata))

    def __mapping__(self) -> dict[str, Handler]:
        return {
            f"/{SERVICE}/Echo": Handler(self.echo, Cardinality.UNARY_UNARY, EchoRequest, EchoResponse),
            f"/{SERVICE}/EchoStream": Handler(
                self.echo_stream, Cardinality.UNARY_STREAM, EchoStreamRequest, EchoResponse
            ),
        }


async def _until_exists(path: anyio.Path) -> None:
    while not await path.exists():  # noqa: ASYNC110 - a file appearing has no event to wait on
        await asyncio.sleep(0.01)


@final
class Health(HealthBase):
    """SERVING for the whole server and the echo service."""

    async def check(self, health_check_request: HealthCheckRequest) -> HealthCheckResponse:
        if health_check_request.service not in ("", SERVICE):
            raise GRPCError(Status.NOT_FOUND, f"unknown service {health_check_request.service!r}")
        return HealthCheckResponse(status=HealthCheckResponseServingStatus(HealthCheckResponseServingStatus.SERVING))

    async def watch(self, health_check_request: HealthCheckRequest) -> AsyncIterator[HealthCheckResponse]:
        yield await self.check(health_check_request)
        await asyncio.Event().wait()


async def serve(host: str, port: int) -> None:
    """Serve until SIGTERM or SIGINT."""
    # Status details as google.rpc.Status bytes, as servers with googleapis' protos send them.
    server = Server([EchoService(), Health()], status_details_codec=RawStatusDetails())
    with graceful_exit([server], signals=(signal.SIGINT, signal.SIGTERM)):
        await server.start(host, port, reuse_address=True)
        await server.wait_closed()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=int(os.environ.get("INFERENCE_PORT", "8000")))  # noqa: TID251
    parser.add_argument("--host", default="127.0.0.1")
    args = parser.parse_args()
    asyncio.run(serve(args.host, args.port))


if __name__ == "__main__":
    main()
