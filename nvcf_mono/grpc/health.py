"""grpc.health.v1: "" is the whole host (serving once ready), each plugin name is a service of its own."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import final

from grpclib.const import Status as GrpcStatus
from grpclib.exceptions import GRPCError

from nvcf_mono.bus.mirror import Signal
from nvcf_mono.proto.gen.grpc.health.v1 import (
    HealthBase,
    HealthCheckRequest,
    HealthCheckResponse,
    HealthCheckResponseServingStatus,
)

Status = HealthCheckResponseServingStatus
#: service name -> serving? (None: unknown service)
StatusSource = Callable[[str], bool | None]


@final
class HealthServicer(HealthBase):
    """Answers Check and streams Watch from the host's readiness."""

    def __init__(self, source: StatusSource) -> None:
        self._source = source
        self._changes = Signal()

    def notify(self) -> None:
        """Wake Watch streams after a state change."""
        self._changes.notify()

    def _status(self, service: str) -> Status:
        serving = self._source(service)
        if serving is None:
            return Status(Status.SERVICE_UNKNOWN)
        return Status(Status.SERVING if serving else Status.NOT_SERVING)

    async def check(self, health_check_request: HealthCheckRequest) -> HealthCheckResponse:
        status = self._status(health_check_request.service)
        if status is Status.SERVICE_UNKNOWN:
            raise GRPCError(GrpcStatus.NOT_FOUND, f"unknown service {health_check_request.service!r}")
        return HealthCheckResponse(status=status)

    async def watch(self, health_check_request: HealthCheckRequest) -> AsyncIterator[HealthCheckResponse]:
        last: Status | None = None
        while True:
            seen = self._changes.version
            status = self._status(health_check_request.service)
            if status is not last:
                last = status
                yield HealthCheckResponse(status=status)
            await self._changes.wait(after=seen)
