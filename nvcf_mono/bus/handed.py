"""A JetStream delivery pulled by another connection and handed to this one.

JetStream settles a delivery by a message to its ack subject, from any connection; so a node that
was handed a delivery (with its ack subject and counters) holds it as fully as the puller did:
ack, nak, term and in-progress go straight to the server.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import final

from nvcf_mono.bus.api import Bus, Headers

#: JetStream's acknowledgements (NAK: redeliver now, or after a delay in nanoseconds).
ACK, NAK, PROGRESS, TERM = b"+ACK", b"-NAK", b"+WPI", b"+TERM"


@final
class HandedDelivery:
    """A :class:`~nvcf_mono.bus.api.Delivery` settled through ``bus`` by its ack subject."""

    @property
    def timestamp(self) -> datetime | None:
        """Not known: only its ack subject was handed over."""
        return None

    def __init__(
        self,
        bus: Bus,
        *,
        ack_subject: str,
        subject: str,
        data: bytes,
        num_delivered: int,
        stream_seq: int = 0,
        consumer_seq: int = 0,
        num_pending: int = 0,
        headers: Headers | None = None,
    ) -> None:
        self._bus = bus
        self.ack_subject = ack_subject
        self.subject = subject
        self.data = data
        self.headers: Headers = headers or {}
        self.num_delivered = num_delivered
        self.stream_seq = stream_seq
        self.consumer_seq = consumer_seq
        self.num_pending = num_pending

    async def ack(self) -> None:
        await self._bus.publish(self.ack_subject, ACK)

    async def ack_sync(self, *, timeout: float | None = None) -> None:
        await self._bus.request(self.ack_subject, ACK, timeout=timeout or 5.0)

    async def nak(self, delay: float | None = None) -> None:
        after = b" " + json.dumps({"delay": int(delay * 1e9)}).encode() if delay else b""  # nanoseconds
        await self._bus.publish(self.ack_subject, NAK + after)

    async def in_progress(self) -> None:
        await self._bus.publish(self.ack_subject, PROGRESS)

    async def term(self) -> None:
        await self._bus.publish(self.ack_subject, TERM)

    def hand_off(self) -> None:
        """Nothing is held here but the right to settle it."""
