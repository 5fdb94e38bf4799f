"""The gateway's limits across invocation nodes: each node reports what its calls took, the others take it too.

Every :data:`REPORT_EVERY` seconds a node that took anything publishes it on a core subject: per bucket
(an account's or a key's requests or tokens), the sum of what its calls took since its last report,
usage corrections included (a call that used less than estimated gives back). Every other node takes
the same from its own buckets (:class:`~.limits.Limits`). A report costs one message per interval per
node, however many calls, and grows with the callers active in it.

A node that starts late, or misses a report (core subjects do not buffer), starts from fuller buckets:
the limit is a little looser there for a minute at most, never stricter.
"""

from __future__ import annotations

import logging
import math
import uuid
from typing import Any, final

import anyio
import orjson
from anyio.abc import TaskStatus

from nvcf_mono.bus.api import Bus
from nvcf_mono.bus.errors import BusError
from nvcf_mono.contracts import subjects
from nvcf_mono.planes.invocation.llm.limits import KINDS, SCOPES, Key, Limits

#: How often a node reports what it took: how far behind the others' buckets can be.
REPORT_EVERY = 0.5
#: Buckets per message: a report of more goes out in several (each well under the bus's max payload).
PER_MESSAGE = 2_000
#: An id longer than this is no account or key id: such an entry is dropped.
_MAX_ID = 256


@final
class LimitSharing:
    """A node's side: its reports sent, the others' taken."""

    def __init__(self, bus: Bus, limits: Limits, node: str, log: logging.Logger) -> None:
        self._bus = bus
        self._limits = limits
        # Unique per process: two nodes started with one configured id (or none) still hear each other.
        self._node = f"{node}-{uuid.uuid4().hex[:8]}"
        self._log = log

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        async with anyio.create_task_group() as tg:
            await tg.start(self._hear)
            try:
                await self._bus.flush(timeout=5)  # the server has the subscription: no report is missed from here
            except BusError as err:
                self._log.warning("gateway limits: the bus did not confirm this node's subscription: %s", err)
            self._limits.sharing = True
            try:
                task_status.started()
                while True:
                    await anyio.sleep(REPORT_EVERY)
                    await self.report()
            finally:
                self._limits.sharing = False
                tg.cancel_scope.cancel()

    async def report(self) -> None:
        """Publish what this node took since its last report (nothing when it took nothing)."""
        entries = [[scope, ident, kind, amount] for (scope, ident, kind), amount in self._limits.taken().items()]
        for start in range(0, len(entries), PER_MESSAGE):
            doc = {"n": self._node, "t": entries[start : start + PER_MESSAGE]}
            try:
                await self._bus.publish(subjects.LLM_GATEWAY_TAKEN, orjson.dumps(doc))
            except BusError as err:  # the others' limits are looser for a while, never stricter
                self._log.warning("the gateway's usage report did not go out: %s", err)
                return

    async def _hear(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        async with self._bus.subscribe(subjects.LLM_GATEWAY_TAKEN) as sub:
            task_status.started()
            async for msg in sub:
                try:
                    node, entries = _parse(msg.data)
                except ValueError as err:
                    self._log.warning("ignoring a malformed gateway usage report: %s", err)
                    continue
                if node == self._node:
                    continue  # its own: already taken
                for key, amount in entries:
                    self._limits.take(key, amount)


def _parse(data: bytes) -> tuple[str, list[tuple[Key, float]]]:
    """(the reporting node, its entries); ValueError for anything not a report."""
    try:
        doc: Any = orjson.loads(data)
    except orjson.JSONDecodeError as err:
        raise ValueError(f"not JSON: {err}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("n"), str) or not isinstance(doc.get("t"), list):
        raise ValueError(f"not a report: {data[:200]!r}")
    entries = []
    for entry in doc["t"]:
        match entry:
            case [str(scope), str(ident), str(kind), int() | float() as amount] if (
                scope in SCOPES
                and kind in KINDS
                and 0 < len(ident) <= _MAX_ID
                and not isinstance(amount, bool)
                and math.isfinite(amount)
            ):
                entries.append(((scope, ident, kind), float(amount)))
            case _:
                raise ValueError(f"a malformed entry {str(entry)[:200]}")
    return doc["n"], entries
