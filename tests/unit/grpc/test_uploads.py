"""An upload the server refuses part-way reads as the server's status, not as a closed HTTP/2 stream.

A real grpclib server and client on 127.0.0.1. The server reads the first message and refuses; the
client goes on sending only once the refusal has reached it, which is the order a loaded machine
produced in a full test run (a worker then died on h2's ``StreamClosedError``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
from grpclib.client import Channel
from grpclib.const import Cardinality, Handler, Status
from grpclib.exceptions import GRPCError, StreamTerminatedError
from grpclib.server import Server
from h2.exceptions import StreamClosedError

import nvcf_mono.grpc  # noqa: F401 - as every gRPC process does
from nvcf_mono.grpc.raw import RawMessage
from nvcf_mono.grpc.uploads import upload

pytestmark = pytest.mark.anyio
PATH = "/test.Uploads/Put"
CHUNK = RawMessage(b"x" * 64 * 1024)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # grpclib is asyncio's


class Refusing:
    def __init__(self, *, limit: int) -> None:
        self.limit = limit
        self.refused = anyio.Event()

    def __mapping__(self) -> dict[str, Handler]:
        return {PATH: Handler(self.put, Cardinality.STREAM_UNARY, RawMessage, RawMessage)}

    async def put(self, stream: Any) -> None:
        taken = 0
        async for message in stream:
            taken += len(message.data)
            if taken > self.limit:
                self.refused.set()
                raise GRPCError(Status.RESOURCE_EXHAUSTED, f"over the limit of {self.limit} bytes")
        await stream.send_message(RawMessage(str(taken).encode()))


async def chunks(service: Refusing, count: int) -> AsyncIterator[RawMessage]:
    """``count`` chunks. When the first is over the server's limit, the rest wait until the server has
    refused it and its answer and its reset of the stream have reached the client."""
    for i in range(count):
        yield CHUNK
        if i == 0 and len(CHUNK.data) > service.limit:
            await service.refused.wait()
            await anyio.sleep(0.3)


@asynccontextmanager
async def serving(service: Refusing) -> AsyncIterator[Channel]:
    server = Server([service])
    await server.start("127.0.0.1", 0)
    port = server._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    channel = Channel("127.0.0.1", port)
    try:
        with anyio.fail_after(20):
            yield channel
    finally:
        channel.close()
        server.close()
        await server.wait_closed()


async def test_a_refusal_part_way_is_the_servers_status() -> None:
    service = Refusing(limit=1)
    async with serving(service) as channel:
        for count in (1, 50):  # refused before the end of the stream, and before more messages
            # Ending the stream as the callers did before fails on the closed stream, saying nothing of why.
            if count == 1:
                with pytest.raises((StreamClosedError, StreamTerminatedError)):
                    async with channel.request(PATH, Cardinality.STREAM_UNARY, RawMessage, RawMessage) as stream:
                        async for message in chunks(service, count):
                            await stream.send_message(message)
                        await stream.end()
                service.refused = anyio.Event()
            with pytest.raises(GRPCError) as refused:
                async with channel.request(PATH, Cardinality.STREAM_UNARY, RawMessage, RawMessage) as stream:
                    await upload(stream, chunks(service, count))
            assert refused.value.status is Status.RESOURCE_EXHAUSTED
            assert refused.value.message == "over the limit of 1 bytes"
            service.refused = anyio.Event()


async def test_an_upload_taken_whole_returns_the_reply() -> None:
    service = Refusing(limit=10 * 1024 * 1024)
    async with (
        serving(service) as channel,
        channel.request(PATH, Cardinality.STREAM_UNARY, RawMessage, RawMessage) as stream,
    ):
        reply = await upload(stream, chunks(service, 5))
    assert reply is not None and reply.data == str(5 * len(CHUNK.data)).encode()
