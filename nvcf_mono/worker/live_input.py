"""A live gRPC call's client stream, asked of the worker's node on the grpc transport.

The worker has no NATS connection there: it asks its node over the Serve stream (``InputWanted``),
and the node asks the client's node and sends the answer down (``InputChunk``). One question per
call is open at a time; an answer that does not come reads as "ask again".
"""

from __future__ import annotations

from typing import final

import anyio
from anyio.streams.memory import MemoryObjectSendStream

from nvcf_mono.contracts import live_input
from nvcf_mono.proto.gen.nvcf.worker.v1 import InputChunk, InputWanted, WorkerMessage
from nvcf_mono.proto.serve_wire import WorkerEnvelope

#: How long an answer may take: the client's node holds the question, and the node's own question to it
#: may wait a little longer.
_PATIENCE = live_input.HOLD_SECONDS + 20


@final
class _Question:
    def __init__(self, offset: int) -> None:
        self.offset = offset
        self.answer: bytes | None = None
        self.answered = anyio.Event()


@final
class NodeInputs:
    def __init__(self) -> None:
        self._open: dict[str, _Question] = {}

    async def fetch(self, out: MemoryObjectSendStream[WorkerEnvelope], request_id: str, offset: int) -> bytes:
        """The answer for ``request_id``'s stream from ``offset`` (``W`` if none came in time)."""
        question = self._open[request_id] = _Question(offset)
        try:
            wanted = InputWanted(request_id=request_id, offset=offset)
            await out.send(WorkerEnvelope(message=WorkerMessage(input_wanted=wanted)))
            with anyio.move_on_after(_PATIENCE):
                await question.answered.wait()
        finally:
            if self._open.get(request_id) is question:
                del self._open[request_id]
        return question.answer if question.answer is not None else live_input.WAIT

    def arrived(self, chunk: InputChunk) -> None:
        """An answer from the node: to its question, if that is still open (a late one is dropped)."""
        question = self._open.get(chunk.request_id)
        if question is not None and question.offset == chunk.offset:
            question.answer = chunk.answer
            question.answered.set()
