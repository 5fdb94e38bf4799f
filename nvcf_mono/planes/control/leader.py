"""A leader lease in KV: one holder at a time across control-plane processes, taken over within a TTL.

The holder creates the key with a TTL and renews it (compare-and-set on its revision) every third
of the TTL. If renewal fails, or the holder cannot reach the bus for most of the TTL, it steps down
before another process can take over, so two leaders never act at once (writes they make are CAS
on top of that). A write whose answer was lost (a busy store) may still have landed: a revision
that no longer matches is read back, and a lease that still names this holder is kept.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import final

import anyio
from anyio.abc import TaskStatus

from nvcf_mono.bus.codec import TypedKV, Versioned
from nvcf_mono.bus.errors import BusError, ConflictError
from nvcf_mono.contracts.buckets import Lease
from nvcf_mono.models.common import now_iso


@final
class LeaderLease:
    """Run ``lead()`` only while this process holds the lease."""

    def __init__(self, kv: TypedKV[Lease], name: str, *, node: str, ttl: float, log: logging.Logger) -> None:
        self._kv = kv
        self._name = name
        self.holder = f"{node}:{uuid.uuid4().hex[:8]}"
        self._ttl = ttl
        self._log = log
        self.is_leader = False

    async def run(
        self, lead: Callable[[], Awaitable[None]], *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Contend forever; while leader, run ``lead`` (cancelled when the lease is lost)."""
        task_status.started()
        while True:
            revision = await self._acquire()
            self._log.info("%s: leader (%s)", self._name, self.holder)
            self.is_leader = True
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._renew, revision, tg.cancel_scope)
                    await lead()
                    tg.cancel_scope.cancel()
            finally:
                self.is_leader = False
            self._log.info("%s: no longer leader", self._name)

    async def _acquire(self) -> int:
        while True:
            now = now_iso()
            try:
                return await self._kv.create(
                    self._name, Lease(holder=self.holder, acquired_at=now, renewed_at=now), ttl=self._ttl
                )
            except ConflictError:
                with contextlib.suppress(BusError, TimeoutError):
                    current = await self._current()  # a create or renewal of ours that landed unanswered
                    if current is not None and current.value.holder == self.holder:
                        # Renewed at once: when that write landed is unknown, so its time left is too.
                        lease = Lease(holder=self.holder, acquired_at=now, renewed_at=now)
                        return await self._kv.update(self._name, lease, revision=current.revision, ttl=self._ttl)
            except BusError as err:
                self._log.debug("%s: cannot contend for the lease: %s", self._name, err)
            await anyio.sleep(self._ttl / 5)

    async def _current(self) -> Versioned[Lease] | None:
        """The lease as stored (None: expired); raises BusError or TimeoutError when the store cannot tell."""
        with anyio.fail_after(self._ttl / 3):
            return await self._kv.get(self._name)

    async def _renew(self, revision: int, scope: anyio.CancelScope) -> None:
        acquired = now_iso()
        valid_until = time.monotonic() + self._ttl * 0.8
        #: When the first renewal since the last answered one was sent: one that landed did so after it.
        unanswered: float | None = None
        while True:
            await anyio.sleep(self._ttl / 3)
            sent = time.monotonic()
            try:
                try:
                    with anyio.fail_after(self._ttl / 3):
                        revision = await self._kv.update(
                            self._name,
                            Lease(holder=self.holder, acquired_at=acquired, renewed_at=now_iso()),
                            revision=revision,
                            ttl=self._ttl,
                        )
                    valid_until, unanswered = sent + self._ttl * 0.8, None
                except ConflictError:
                    current = await self._current()
                    if current is None or current.value.holder != self.holder:
                        if current is None:
                            self._log.warning("%s: the lease expired before it was renewed", self._name)
                        else:
                            self._log.warning("%s: the lease was taken over by %s", self._name, current.value.holder)
                        scope.cancel()
                        return
                    revision = current.revision  # a renewal landed though its answer was lost: go on from it
                    if unanswered is not None:
                        valid_until, unanswered = max(valid_until, unanswered + self._ttl * 0.8), None
            except (BusError, TimeoutError) as err:  # no answer, to the renewal or to reading it back
                unanswered = sent if unanswered is None else unanswered
                if time.monotonic() >= valid_until:
                    self._log.warning("%s: cannot renew the lease (%s); stepping down", self._name, err)
                    scope.cancel()
                    return

    async def release(self) -> None:
        """Give the lease up (at shutdown) so another process takes over at once."""
        if not self.is_leader:
            return
        with anyio.move_on_after(2, shield=True):
            try:
                current = await self._kv.get(self._name)
                if current is not None and current.value.holder == self.holder:
                    await self._kv.delete(self._name, revision=current.revision)
            except BusError:
                pass
