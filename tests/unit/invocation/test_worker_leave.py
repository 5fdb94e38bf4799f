"""A stopping invocation node's WorkerService: its sessions leave, and new ones are refused."""

from __future__ import annotations

import logging
from typing import Any

import anyio
import pytest
from grpclib.const import Status
from grpclib.exceptions import GRPCError

from nvcf_mono.planes.invocation.config import InvocationConfig
from nvcf_mono.planes.invocation.workers import WorkerService, WorkerSession
from nvcf_mono.proto.serve_wire import NODE_STOPPING

pytestmark = pytest.mark.anyio


class _NeverRead:
    """A stream the refusal must not touch (it answers before reading anything)."""

    async def recv_message(self) -> Any:
        raise AssertionError("read from a call that a stopping node refuses")


async def test_a_leaving_node_refuses_new_sessions_and_its_sessions_take_no_more_requests() -> None:
    service = WorkerService(InvocationConfig(), logging.getLogger("tests.leave"))
    session = WorkerSession(service, function_id="f", function_version_id="v", instance_id="i", max_concurrency=2)
    service.sessions[session.id] = session
    assert session.serving
    service.leave()
    assert not session.serving and not session.has_room, "a leaving session is offered nothing"
    for call in (service._connect_once, service._serve):
        with anyio.fail_after(5), pytest.raises(GRPCError) as refused:
            await call(_NeverRead())  # type: ignore[arg-type]
        assert (refused.value.status, refused.value.message) == (Status.UNAVAILABLE, NODE_STOPPING)
