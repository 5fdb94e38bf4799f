"""Session affinity across invocation nodes: who took a conversation, and handing a turn to its node.

A node announces on a core subject that one of its instances took a conversation's turn (when the
conversation is new there or moved, and again every few minutes while it goes on); every node keeps
what it hears in its :class:`~.affinity.Affinity` table. A node whose worker pulled a turn whose
instance is connected to another node asks that node to take it: a core request carrying the
delivery (the request's bytes, its ack subject and counters). The other node serves it with the
usual settlement, acking through the ack subject (:class:`~nvcf_mono.bus.handed.HandedDelivery`).
The answer decides:

- **taken**: the other node holds it; this node frees the consumer slot and sends nothing more;
- **refused** (the instance is busy, draining or gone; or nobody listens on that node's subject):
  served here, as without affinity;
- **no answer in time**: the other node may have taken it, so serving it here as well could run it
  twice. It is left alone: if nobody holds it, JetStream delivers it again after the ack wait (and
  this node forgets the conversation's instance, so that delivery is served wherever it is pulled).

A request too large to pass on in one message (its body inside, near the server's max payload) is
served where it was pulled.

Nothing is stored: affinity is a preference, and a node started later learns a conversation at its
next turn.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Literal, final

import anyio
import orjson
from anyio.abc import TaskStatus

from nvcf_mono.bus.api import Bus, Delivery, Msg
from nvcf_mono.bus.errors import BusError, NoResponders
from nvcf_mono.bus.handed import HandedDelivery
from nvcf_mono.contracts import subjects
from nvcf_mono.metrics import Metrics
from nvcf_mono.planes.invocation.affinity import Affinity, Place

#: How long a node waits for another to take a turn (it only has to put it in a worker's queue).
TIMEOUT = 2.0
Outcome = Literal["taken", "refused", "unknown"]
#: (version, instance, delivery) -> whether that instance, connected to this node, took it.
Take = Callable[[str, str, Delivery], Awaitable[bool]]

_VERSION, _INSTANCE, _ACK, _SUBJECT, _COUNTS = (
    "Nvcf-Version",
    "Nvcf-Instance",
    "Nvcf-Ack",
    "Nvcf-Subject",
    "Nvcf-Delivery",
)
_TAKEN, _REFUSED = b"taken", b"refused"
#: Room left for the handover's headers beside the request in one message.
_HEADROOM = 1024


@final
class Handover:
    """A node's side of cross-node session affinity: announcements heard and sent, turns offered and taken."""

    def __init__(self, bus: Bus, affinity: Affinity, metrics: Metrics, log: logging.Logger) -> None:
        self._bus = bus
        self._affinity = affinity
        self._log = log
        #: Turns given to their conversation's instance by the node that pulled them.
        self.handovers = metrics.counter(
            "nvcf_invocation_affinity_handovers_total",
            "Conversation turns handed to the instance of the conversation's last turn: to a session of this "
            "node (local), to another node that took it or refused it, or with no answer (unknown: left "
            "to redelivery).",
            ["outcome"],
        )

    async def run(self, take: Take, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        subject = subjects.affinity_take_subject(self._affinity.node)
        async with anyio.create_task_group() as tg:
            await tg.start(self._hear)
            await tg.start(partial(self._bus.serve, subject, partial(self._take, take), concurrency=64))
            try:
                await self._bus.flush(timeout=TIMEOUT)  # started: the server has both subscriptions
            except BusError as err:
                self._log.warning("session affinity: the bus did not confirm this node's subscriptions: %s", err)
            task_status.started()

    # ---- who took what --------------------------------------------------------------------------

    async def announce(self, version_id: str, key: str, instance_id: str) -> None:
        """Tell the other nodes that an instance connected here took the conversation's latest turn."""
        doc = {"v": version_id, "k": key, "i": instance_id, "n": self._affinity.node}
        try:
            await self._bus.publish(subjects.AFFINITY_TOOK, orjson.dumps(doc))
        except BusError as err:  # a preference: the next turn announces again
            self._log.debug("could not announce a conversation's instance: %s", err)

    async def _hear(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        async with self._bus.subscribe(subjects.AFFINITY_TOOK) as sub:
            task_status.started()
            async for msg in sub:
                try:
                    doc = orjson.loads(msg.data)
                    version, key, place = str(doc["v"]), str(doc["k"]), Place(str(doc["i"]), str(doc["n"]))
                except (orjson.JSONDecodeError, KeyError, TypeError):
                    self._log.warning("ignoring a malformed affinity announcement: %r", msg.data[:200])
                    continue
                self._affinity.heard(version, key, place)

    # ---- handing a turn over --------------------------------------------------------------------

    async def offer(self, place: Place, version_id: str, delivery: Delivery) -> Outcome:
        """Ask ``place``'s node to give ``delivery`` to its instance."""
        outcome = await self._offer(place, version_id, delivery)
        self.handovers.inc(outcome=outcome)
        return outcome

    async def _offer(self, place: Place, version_id: str, delivery: Delivery) -> Outcome:
        if len(delivery.data) + _HEADROOM > self._bus.max_payload:
            return "refused"  # too large to pass on in one message: served where it was pulled
        headers = {
            _VERSION: version_id,
            _INSTANCE: place.instance,
            _ACK: delivery.ack_subject,
            _SUBJECT: delivery.subject,
            _COUNTS: f"{delivery.num_delivered} {delivery.stream_seq} {delivery.consumer_seq} {delivery.num_pending}",
        }
        subject = subjects.affinity_take_subject(place.node)
        try:
            reply = await self._bus.request(subject, delivery.data, timeout=TIMEOUT, headers=headers)
        except NoResponders:
            return "refused"  # nobody heard it: that node is gone
        except BusError as err:
            self._log.warning(
                "node %s did not answer whether it took a turn (%s); it is redelivered after the ack wait "
                "unless that node serves it",
                place.node,
                err,
            )
            return "unknown"
        return "taken" if reply.data == _TAKEN else "refused"

    async def _take(self, take: Take, msg: Msg) -> bytes:
        headers = msg.headers
        delivered, stream_seq, consumer_seq, pending = (int(n) for n in headers[_COUNTS].split())
        delivery = HandedDelivery(
            self._bus,
            ack_subject=headers[_ACK],
            subject=headers[_SUBJECT],
            data=msg.data,
            num_delivered=delivered,
            stream_seq=stream_seq,
            consumer_seq=consumer_seq,
            num_pending=pending,
        )
        return _TAKEN if await take(headers[_VERSION], headers[_INSTANCE], delivery) else _REFUSED
