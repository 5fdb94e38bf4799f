"""A gRPC inference server on grpcio that compresses every answer (gzip), as servers set to compress do.

``python -m tests.support.grpcio_echo --port P``: ``examples.echo.v1.EchoService/Echo`` (the message
back, with the metadata the call arrived with) and ``grpc.health.v1.Health/Check`` (SERVING). grpclib,
which the platform's worker uses, cannot send compressed messages, so this server is grpcio's.
"""

from __future__ import annotations

import argparse
import os
import signal
from concurrent import futures
from typing import Any

import grpc

from nvcf_mono.proto.gen.examples.echo.v1 import EchoRequest, EchoResponse
from nvcf_mono.proto.gen.grpc.health.v1 import HealthCheckRequest, HealthCheckResponse, HealthCheckResponseServingStatus


def echo(request: EchoRequest, context: Any) -> EchoResponse:
    metadata = {key: value for key, value in context.invocation_metadata() if isinstance(value, str)}
    return EchoResponse(message=request.message * max(request.repeats, 1), metadata=metadata)


def check(request: HealthCheckRequest, context: Any) -> HealthCheckResponse:
    return HealthCheckResponse(status=HealthCheckResponseServingStatus.SERVING)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=int(os.environ.get("INFERENCE_PORT", "8000")))
    args = parser.parse_args()
    server = grpc.server(futures.ThreadPoolExecutor(4), compression=grpc.Compression.Gzip)
    server.add_generic_rpc_handlers(
        [
            grpc.method_handlers_generic_handler(
                "examples.echo.v1.EchoService",
                {"Echo": grpc.unary_unary_rpc_method_handler(echo, EchoRequest().parse, bytes)},
            ),
            grpc.method_handlers_generic_handler(
                "grpc.health.v1.Health",
                {"Check": grpc.unary_unary_rpc_method_handler(check, HealthCheckRequest().parse, bytes)},
            ),
        ]
    )
    server.add_insecure_port(f"127.0.0.1:{args.port}")
    server.start()
    signal.signal(signal.SIGTERM, lambda *_: server.stop(0))
    server.wait_for_termination()


if __name__ == "__main__":
    main()
