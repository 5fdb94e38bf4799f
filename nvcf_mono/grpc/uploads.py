"""Client-streaming calls (an upload: many messages, one answer) whose server may answer early.

A server that refuses an upload part-way (too large, not allowed) answers and closes the call while
the client is still sending. The client's next send, or its end of the stream, then fails on the
closed HTTP/2 stream (h2's ``StreamClosedError``, which grpclib passes on as it is and which says
nothing of why; a worker died of it). The server's answer is there all the same: reading it raises the
``GRPCError`` with the server's status, or, when the server also reset the stream, grpclib's
``StreamTerminatedError``, which the call's ``async with`` turns into that ``GRPCError`` on the way out.
"""

from __future__ import annotations

from collections.abc import AsyncIterable
from typing import TypeVar

from grpclib.client import Stream

from nvcf_mono.grpc.batch import STREAM_GONE

Send = TypeVar("Send")
Reply = TypeVar("Reply")


async def upload(stream: Stream[Send, Reply], messages: AsyncIterable[Send]) -> Reply | None:
    """Send ``messages`` on grpclib's client ``stream``, end it, and return the server's reply.

    Call it inside the call's ``async with``: a refusal then comes out of it as the server's ``GRPCError``.
    """
    try:
        async for message in messages:
            await stream.send_message(message)
        await stream.end()
    except STREAM_GONE:
        pass  # the server answered before taking everything: its answer says why
    return await stream.recv_message()
