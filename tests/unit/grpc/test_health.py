"""The host's grpc.health.v1 service: Check answers from the source, Watch streams each change once."""

from __future__ import annotations

import anyio
import pytest
from grpclib.exceptions import GRPCError

from nvcf_mono.grpc.health import HealthServicer, Status
from nvcf_mono.proto.gen.grpc.health.v1 import HealthCheckRequest


async def test_check_and_watch_follow_the_source() -> None:
    serving = {"": False}
    health = HealthServicer(serving.get)
    assert (await health.check(HealthCheckRequest(service=""))).status == Status.NOT_SERVING
    with pytest.raises(GRPCError):
        await health.check(HealthCheckRequest(service="nope"))
    seen: list[Status] = []
    with anyio.fail_after(5):
        async for reply in health.watch(HealthCheckRequest(service="")):
            seen.append(reply.status)
            if len(seen) == 1:
                health.notify()  # nothing changed: no second answer for it
                serving[""] = True
                health.notify()
            else:
                break
    assert seen == [Status.NOT_SERVING, Status.SERVING]
