"""Live input: the client's later gRPC messages, fetched by whoever serves the call, while it runs.

A gRPC call whose client keeps its side open is stored with the messages it had sent (its body)
and ``live_input`` set; the rest of the client's stream stays with the node that holds the client.
The call's server (the worker's node on the grpc transport, the worker itself on the nats
transport) asks that node for it, one piece at a time, by byte offset into the client's stream
after the body, on ``nvcf.input.<inbox>.<requestId>.<capability>`` (the response subject's
twin: the capability that came inside the request is needed to read it). Asking by offset makes a
redelivered call read the same stream again from its start, and a lost answer harmless.

The question is the offset as decimal ASCII. The answer is one kind byte and data:

- ``D``: the bytes from the offset on (length-prefixed gRPC messages, perhaps cut mid-message);
- ``E``: the same, and the client closed its side after them (the data may be empty);
- ``W``: nothing new within the node's wait: ask again;
- ``G``: gone: the call ended (the client left or it was cancelled), or the capability was wrong.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, Literal

import anyio

from nvcf_mono.bus.errors import BusError, NoResponders, RequestTimeout

if TYPE_CHECKING:  # a worker on the grpc transport imports this module and never the bus
    from nvcf_mono.bus.api import Bus

Kind = Literal["D", "E", "W", "G"]
DATA: Final = b"D"
END: Final = b"E"
WAIT: Final = b"W"
GONE: Final = b"G"

#: How long the client's node holds a question open when nothing new has come.
HOLD_SECONDS: Final = 10.0
#: How long to wait before asking again when the bus could not take the question at all.
RETRY_PAUSE: Final = 0.5
#: Most bytes in one answer (core NATS carries it: well under its payload limit).
MOST_BYTES: Final = 256 * 1024


def question(offset: int) -> bytes:
    return str(offset).encode()


def parse_question(data: bytes) -> int | None:
    """The offset asked for; None when it is not a small non-negative decimal."""
    if not data or len(data) > 12 or not data.isdigit():
        return None
    return int(data)


def answer(kind: bytes, data: bytes = b"") -> bytes:
    return kind + data


def read_answer(blob: bytes) -> tuple[Kind, bytes]:
    """(kind, data) of an answer; an unknown kind reads as gone."""
    kind = blob[:1].decode("ascii", errors="replace")
    if kind in ("D", "E", "W"):
        return kind, blob[1:]  # type: ignore[return-value]
    return "G", b""


async def fetch(bus: Bus, subject: str, offset: int) -> bytes:
    """Ask the client's node for the stream from ``offset``; an answer (``W`` when it said nothing in time)."""
    try:
        reply = await bus.request(subject, question(offset), timeout=HOLD_SECONDS + 5)
    except NoResponders:
        return GONE  # the client's node is gone, and the client with it
    except RequestTimeout:
        return WAIT  # a busy node is not yet an end: the caller asks again
    except BusError:
        # The bus is away (reconnecting): not an end either, but asking again at once would only spin.
        await anyio.sleep(RETRY_PAUSE)
        return WAIT
    return reply.data
