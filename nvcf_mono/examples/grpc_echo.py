"""gRPC echo function: ``python -m nvcf_mono.examples.grpc_echo --port 8001``.

Serves ``examples.echo.v1.EchoService`` (``nvcf_mono/proto/examples/echo/v1/echo.proto``): unary
``Echo`` answers ``message`` repeated ``repeats`` times after ``delay_seconds``; server-streaming
``EchoStream`` answers ``repeats`` messages, ``delay_seconds`` apart. ``grpc.health.v1`` says SERVING.

Register it with ``inferenceUrl: /grpc``, ``inferencePort: 8001``, ``containerImage: grpc-echo`` and
``health: {protocol: gRPC, port: 8001}``; clients call the platform's gRPC port with the metadata
``authorization: Bearer <api key>`` and ``function-id: <fid>``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
from collections.abc import AsyncIterator

from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.server import Server
from grpclib.utils import graceful_exit

from nvcf_mono.proto.gen.examples.echo.v1 import EchoRequest, EchoResponse, EchoServiceBase, EchoStreamRequest
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


class EchoService(EchoServiceBase):
    """The echo service."""

    async def echo(self, echo_request: EchoRequest) -> EchoResponse:
        """The message, ``repeats`` times (once when 0, proto3's unset)."""
        _check(echo_request.repeats, echo_request.delay_seconds)
        await asyncio.sleep(echo_request.delay_seconds)
        return EchoResponse(message=echo_request.message * max(echo_request.repeats, 1))

    async def echo_stream(self, echo_stream_request: EchoStreamRequest) -> AsyncIterator[EchoResponse]:
        """``repeats`` messages, one at a time."""
        _check(echo_stream_request.repeats, echo_stream_request.delay_seconds)
        for index in range(max(echo_stream_request.repeats, 1)):
            if index:
                await asyncio.sleep(echo_stream_request.delay_seconds)
            yield EchoResponse(message=echo_stream_request.message, index=index)


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


async def serve(host: str, port: int) -> None:
    """Serve until SIGTERM or SIGINT."""
    server = Server([EchoService(), Health()])
    with graceful_exit([server], signals=(signal.SIGINT, signal.SIGTERM)):
        await server.start(host, port, reuse_address=True)
        await server.wait_closed()


def default_port() -> int:
    """``INFERENCE_PORT``, else ``PORT`` (the local backend sets both per instance), else 8001."""
    return int(os.environ.get("INFERENCE_PORT") or os.environ.get("PORT") or 8001)  # noqa: TID251


def main() -> None:
    """Serve until interrupted."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=default_port(), help="default: $INFERENCE_PORT, $PORT or 8001")
    parser.add_argument("--host", default="127.0.0.1", help="default: 127.0.0.1 (0.0.0.0 in a container)")
    args = parser.parse_args()
    asyncio.run(serve(args.host, args.port))


if __name__ == "__main__":
    main()
