"""gRPC functions (``inferenceUrl: /grpc``): a relayed call made to the inference server (placeholder)."""

from __future__ import annotations

from collections.abc import AsyncIterator

from nvcf_mono.contracts.frames import Frame, Request
from nvcf_mono.worker.config import WorkerConfig


async def grpc_call(config: WorkerConfig, request: Request, body: bytes, *, attempt: int) -> AsyncIterator[Frame]:
    """Relay one gRPC call to the inference server (not implemented yet)."""
    for _ in ():
        yield Frame(request_id=request.request_id, seq=0)
    raise NotImplementedError("gRPC functions are not supported by this worker yet")
