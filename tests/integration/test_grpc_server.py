"""The host's gRPC server on a real socket: closing it ends the calls it held, and peers notice."""

from __future__ import annotations

import logging
from typing import Any

import anyio
import pytest
from grpclib.client import Channel
from grpclib.const import Cardinality, Handler
from grpclib.exceptions import GRPCError, StreamTerminatedError
from grpclib.server import Stream

from nvcf_mono.config.model import GrpcSettings
from nvcf_mono.grpc.raw import RawMessage
from nvcf_mono.grpc.server import GrpcServer
from nvcf_mono.lifecycle import InflightTracker
from nvcf_mono.metrics import Metrics

PATH = "/test.Hold/Forever"


class Hold:
    def __init__(self) -> None:
        self.entered = anyio.Event()

    def __mapping__(self) -> dict[str, Handler]:
        return {PATH: Handler(self.forever, Cardinality.STREAM_STREAM, RawMessage, RawMessage)}

    async def forever(self, stream: Stream[Any, Any]) -> None:
        self.entered.set()
        await anyio.sleep_forever()


async def test_closing_the_server_ends_open_streams_for_their_clients() -> None:
    """A long-lived stream (a worker's session) must end on the client's side when the host stops."""
    hold = Hold()
    server = GrpcServer(
        GrpcSettings(port=0),
        [("plugin", hold)],
        is_running=lambda _: True,
        inflight=InflightTracker(),
        metrics=Metrics(),
        log=logging.getLogger("tests.grpc"),
    )
    port = await server.start()
    channel = Channel("127.0.0.1", port)
    try:
        async with channel.request(PATH, Cardinality.STREAM_STREAM, RawMessage, RawMessage) as stream:
            await stream.send_request()
            with anyio.fail_after(5):
                await hold.entered.wait()
            await server.stop_accepting()
            await server.close()
            with anyio.fail_after(5), pytest.raises((StreamTerminatedError, GRPCError, ConnectionError)):
                await stream.recv_message()
    finally:
        channel.close()
