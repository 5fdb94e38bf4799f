"""A task that lost a gRPC stream is not left counting as cancelled (grpclib's wrapper, patched by
``nvcf_mono.grpc``): structured cancellation still works in it afterwards.
"""

from __future__ import annotations

import asyncio

import anyio
import anyio.lowlevel
import pytest
from grpclib.exceptions import StreamTerminatedError
from grpclib.utils import Wrapper

import nvcf_mono.grpc  # noqa: F401 - installs the patch, as every gRPC process does

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # grpclib is asyncio's


async def test_a_broken_stream_leaves_its_task_uncancelled_and_later_scopes_work() -> None:
    task = asyncio.current_task()
    assert task is not None
    wrapper = Wrapper()

    async def connection_lost() -> None:
        await anyio.sleep(0.01)
        wrapper.cancel(StreamTerminatedError("Connection lost"))

    with anyio.CancelScope() as outer:  # entered before the loss, as a worker's task group is
        async with anyio.create_task_group() as tg:
            tg.start_soon(connection_lost)
            with pytest.raises(StreamTerminatedError, match="Connection lost"), wrapper:
                await anyio.sleep(5)
        assert task.cancelling() == 0
        outer.cancel()
        await anyio.sleep(1)  # cancelled here, and the scope that cancelled ends it
    assert outer.cancelled_caught


async def test_a_wrapper_that_did_not_cancel_changes_nothing() -> None:
    task = asyncio.current_task()
    assert task is not None
    wrapper = Wrapper()
    with wrapper:
        await anyio.lowlevel.checkpoint()
    assert task.cancelling() == 0
    # A cancellation from elsewhere passes through it as it is.
    with anyio.CancelScope() as scope:
        with wrapper:
            scope.cancel()
            await anyio.sleep(1)
    assert scope.cancelled_caught and task.cancelling() == 0
