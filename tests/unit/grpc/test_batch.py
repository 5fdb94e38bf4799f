"""Messages sent a batch at a time arrive whole and in order, both ways, over a real grpclib call.

``send_all`` reads grpclib's stream attributes (there is no API for one write of several messages):
these tests pin that on the installed grpclib, for a client stream and a server stream, on a socket.
"""

from __future__ import annotations

from typing import Any

import anyio
from grpclib.client import Channel
from grpclib.const import Cardinality, Handler
from grpclib.server import Server, Stream

from nvcf_mono.grpc.batch import LARGE_FRAME, accept_large_frames, send_all
from nvcf_mono.grpc.raw import RawMessage
from nvcf_mono.queues import batches

METHOD = "/test.Batch/Echo"


class _Echo:
    """Sends back what it receives, each batch it has as one write, then ``b"end"``."""

    async def echo(self, stream: Stream[RawMessage, RawMessage]) -> None:
        received: list[RawMessage] = []
        async for message in stream:
            received.append(message)
            if message.data == b"flush":
                await send_all(stream, received)
                received = []
        await send_all(stream, [*received, RawMessage(b"end")])

    def __mapping__(self) -> dict[str, Handler]:
        return {METHOD: Handler(self.echo, Cardinality.STREAM_STREAM, RawMessage, RawMessage)}


def _messages(prefix: str, n: int, size: int = 0) -> list[RawMessage]:
    return [RawMessage(f"{prefix}{i}:".encode() + b"x" * size) for i in range(n)]


async def _call(batches_out: list[list[RawMessage]]) -> list[bytes]:
    server = Server([_Echo()])
    await server.start("127.0.0.1", 0)
    port = server._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    channel = Channel("127.0.0.1", port)
    try:
        with anyio.fail_after(10):
            async with channel.request(METHOD, Cardinality.STREAM_STREAM, RawMessage, RawMessage) as stream:
                for batch in batches_out:
                    await send_all(stream, batch)
                await stream.end()
                return [m.data async for m in stream]
    finally:
        channel.close()
        server.close()
        await server.wait_closed()


async def test_batches_arrive_whole_and_in_order_both_ways() -> None:
    sent = [
        _messages("a", 1),  # the call's first message: grpclib sends it (and the headers)
        [*_messages("b", 5), RawMessage(b"flush")],  # one write each way
        [*_messages("c", 64, size=1024), RawMessage(b"flush")],  # larger than an HTTP/2 frame
        _messages("d", 2),
        [RawMessage(b"")],  # an empty message is a message
    ]
    expected = [m.data for batch in sent for m in batch] + [b"end"]
    assert await _call(sent) == expected


async def test_a_first_batch_of_several_goes_out_one_by_one_then_together() -> None:
    sent = [[*_messages("a", 3), RawMessage(b"flush")], _messages("b", 3)]
    assert await _call(sent) == [m.data for batch in sent for m in batch] + [b"end"]


async def test_batches_take_what_is_queued_up_to_the_most_and_end_with_the_stream() -> None:
    send, receive = anyio.create_memory_object_stream[int](100)
    for i in range(7):
        send.send_nowait(i)
    got: list[list[int]] = []

    async def later() -> None:
        await anyio.sleep(0.05)
        send.send_nowait(7)
        send.close()

    with receive:
        async with anyio.create_task_group() as tg:
            tg.start_soon(later)
            got = [batch async for batch in batches(receive, 3)]
    assert got == [[0, 1, 2], [3, 4, 5], [6], [7]]


async def test_an_unstarted_stream_falls_back_to_send_message() -> None:
    sent: list[Any] = []

    class _Stream:
        async def send_message(self, message: Any) -> None:
            sent.append(message)

    await send_all(_Stream(), [1, 2, 3])
    assert sent == [1, 2, 3]


class _LargeEcho:
    """Accepts large frames, then echoes each message; remembers its connection's frame sizes."""

    sizes: tuple[int, int] = (0, 0)

    async def echo(self, stream: Stream[RawMessage, RawMessage]) -> None:
        first = True
        async for message in stream:
            if first:
                accept_large_frames(stream)
                first = False
            await stream.send_message(message)
        h2 = stream._stream.connection._connection  # type: ignore[attr-defined]
        _LargeEcho.sizes = (h2.local_settings.max_frame_size, h2.max_outbound_frame_size)

    def __mapping__(self) -> dict[str, Handler]:
        return {METHOD: Handler(self.echo, Cardinality.STREAM_STREAM, RawMessage, RawMessage)}


async def test_both_ends_of_a_session_accept_and_send_large_frames() -> None:
    server = Server([_LargeEcho()])
    await server.start("127.0.0.1", 0)
    port = server._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    channel = Channel("127.0.0.1", port)
    big = bytes(range(256)) * 4096  # 1 MiB
    try:
        with anyio.fail_after(10):
            async with channel.request(METHOD, Cardinality.STREAM_STREAM, RawMessage, RawMessage) as stream:
                await stream.send_message(RawMessage(b"hello"))
                accept_large_frames(stream)
                hello = await stream.recv_message()
                assert hello is not None and hello.data == b"hello"
                for _ in range(3):
                    await stream.send_message(RawMessage(big))
                    echoed = await stream.recv_message()
                    assert echoed is not None and echoed.data == big
                h2 = stream._stream.connection._connection
                client = (h2.local_settings.max_frame_size, h2.max_outbound_frame_size)
                await stream.end()
                assert [m async for m in stream] == []
    finally:
        channel.close()
        server.close()
        await server.wait_closed()
    # Each end accepts 1 MiB frames and was told the other does: 1 MiB crosses as one DATA frame.
    assert client == (LARGE_FRAME, LARGE_FRAME)
    assert _LargeEcho.sizes == (LARGE_FRAME, LARGE_FRAME)
