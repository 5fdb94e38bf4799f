"""The client's side of a live gRPC call, kept on the node that holds the client for its server to read.

Everything the client sends after the call's body is appended here and read by byte offset
(contracts/live_input.py). Until the function's answer starts, all of it is kept (within the limit of
a whole request body): a call redelivered to another instance reads it again from the start. Once
the answer has started the call cannot move (its client has part of an answer), so what the server
has read is let go, and a session may stream for as long as it likes.

A client that sends faster than the function reads is held back (``WINDOW`` bytes unread at most):
the proxy stops reading, and HTTP/2's flow control tells the client to wait. What is let go is given
back to the account's share of the node's memory (held_input.py), which counted each message as it
was read.
"""

from __future__ import annotations

from typing import final

import anyio

from nvcf_mono.bus.mirror import Signal
from nvcf_mono.contracts import live_input as wire
from nvcf_mono.planes.invocation.held_input import Hold

#: Bytes the client may be ahead of what the call's server has read.
WINDOW = 4 * 1024 * 1024


class InputTooLarge(Exception):
    """The client sent more than the call may hold."""


@final
class LiveInput:
    def __init__(self, limit: int, *, hold: Hold | None = None) -> None:
        self._limit = limit
        self._hold = hold
        #: The client's stream from offset ``_base`` on.
        self._data = bytearray()
        self._base = 0
        #: The highest offset the server asked for: everything before it reached the function's server.
        self._read = 0
        #: Bytes taken out as the call's body (they count towards the limit until the answer starts).
        self._taken = 0
        self._keep_all = True
        #: Counts questions: only the latest one waits (a flood of them holds one answer open, not many).
        self._question = 0
        self._ended = False
        self._gone = False
        self._changes = Signal()

    @property
    def started(self) -> bool:
        """An instance serves the call (it asked for the client's stream)."""
        return self._question > 0

    @property
    def ended(self) -> bool:
        """The client closed its side."""
        return self._ended

    async def append(self, packed: bytes) -> None:
        """One of the client's messages, length-prefixed: waits while the server is ``WINDOW`` behind;
        InputTooLarge when the call would hold more than its limit.
        """
        seen = self._changes.version
        while self._base + len(self._data) - self._read >= WINDOW and not self._gone:
            seen = await self._changes.wait(after=seen)
        kept = len(self._data) + (self._taken if self._keep_all else 0)
        if kept + len(packed) > self._limit:
            raise InputTooLarge(
                f"the request exceeds the limit of {self._limit} bytes (all of a call's messages count until "
                "its answer starts)"
            )
        self._data += packed
        self._changes.notify()

    def end(self) -> None:
        self._ended = True
        self._changes.notify()

    def answered(self) -> None:
        """The function's answer started: what its server has read need not be kept any more."""
        self._keep_all = False

    def close(self) -> None:
        """The call is over: readers are told it is gone, and the bytes are let go."""
        self._gone = True
        self._data = bytearray()
        self._changes.notify()

    def take(self) -> bytes:
        """What came so far, as the call's body; later offsets count from after it."""
        body = bytes(self._data)
        self._taken += len(body)
        self._data = bytearray()
        self._changes.notify()  # room for the client again
        return body

    async def wait_end(self, timeout: float) -> bool:
        """Whether the client closed its side within ``timeout`` seconds."""
        seen = self._changes.version
        with anyio.move_on_after(timeout):
            while not self._ended and not self._gone:
                seen = await self._changes.wait(after=seen)
        return self._ended

    def _reached(self, offset: int) -> None:
        """The server has everything before ``offset``."""
        if offset > self._read:
            self._read = offset
            if not self._keep_all:
                del self._data[: offset - self._base]
                if self._hold is not None:
                    self._hold.give(offset - self._base)
                self._base = offset
            self._changes.notify()

    async def read(self, offset: int, *, hold: float = wire.HOLD_SECONDS) -> bytes:
        """The answer to a question for ``offset``: what is there, else what comes within ``hold`` seconds.

        Gone when the call is over, or for an offset no longer (or never) in the stream. A question
        still waiting when the next one comes is answered ``W`` at once.
        """
        self._question += 1
        mine = self._question
        self._changes.notify()  # an earlier question still waiting gives way
        if self._base <= offset <= self._base + len(self._data):
            self._reached(offset)
        seen = self._changes.version
        with anyio.move_on_after(hold):
            while True:
                if mine != self._question:
                    break
                start = offset - self._base
                if self._gone or start < 0 or start > len(self._data):
                    return wire.answer(wire.GONE)
                if start < len(self._data):
                    chunk = bytes(self._data[start : start + wire.MOST_BYTES])
                    last = self._ended and start + len(chunk) == len(self._data)
                    return wire.answer(wire.END if last else wire.DATA, chunk)
                if self._ended:
                    return wire.answer(wire.END)
                seen = await self._changes.wait(after=seen)
        return wire.answer(wire.WAIT)
