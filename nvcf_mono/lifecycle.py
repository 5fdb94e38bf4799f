"""Small lifecycle pieces the host and plugins share: plugin states and the in-flight work tracker."""

from __future__ import annotations

import enum
from collections.abc import Iterator
from contextlib import contextmanager
from typing import final

import anyio

#: Kinds of in-flight work (:class:`InflightTracker`), as a log line names them.
HTTP_REQUEST, GRPC_CALL, GRPC_STREAM, PLUGIN_JOB = "HTTP request", "gRPC call", "gRPC stream", "plugin job"


class PluginState(enum.Enum):
    """Where a plugin stands (PENDING, STARTING and RETRYING may still reach RUNNING)."""

    PENDING = "pending"
    STARTING = "starting"
    RETRYING = "retrying"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"
    FAILED = "failed"


@final
class InflightTracker:
    """Counts work in progress (HTTP requests, gRPC calls, plugin jobs) so shutdown can wait for it.

    Each unit has a kind (:data:`HTTP_REQUEST`, ...), so shutdown can say what it is waiting for.
    """

    def __init__(self) -> None:
        #: Units in progress by kind; a kind with none is not there.
        self._kinds: dict[str, int] = {}
        self._idle = anyio.Event()
        self._idle.set()
        self._reserved: set[Reservation] = set()
        self._claimed = False

    @property
    def count(self) -> int:
        """Units of work in progress now."""
        return sum(self._kinds.values())

    def of(self, kind: str) -> int:
        """Units of ``kind`` in progress now."""
        return self._kinds.get(kind, 0)

    def enter(self, kind: str = PLUGIN_JOB) -> None:
        """One more unit of work of ``kind`` started."""
        if not self._kinds:
            self._idle = anyio.Event()
        self._kinds[kind] = self._kinds.get(kind, 0) + 1

    def exit(self, kind: str = PLUGIN_JOB) -> None:
        """One unit of work of ``kind`` finished."""
        left = self._kinds[kind] - 1
        if left:
            self._kinds[kind] = left
        else:
            del self._kinds[kind]
        if not self._kinds:
            self._idle.set()

    @contextmanager
    def track(self, kind: str = PLUGIN_JOB) -> Iterator[None]:
        """Count the enclosed block as in-flight work of ``kind``."""
        self.enter(kind)
        try:
            yield
        finally:
            self.exit(kind)

    def reserve(self, kind: str = PLUGIN_JOB) -> Reservation:
        """A unit of ``kind`` that counts from :meth:`claim_reserved` until it is released."""
        reservation = Reservation(self, kind)
        self._reserved.add(reservation)
        if self._claimed:
            reservation.claim()
        return reservation

    def claim_reserved(self) -> None:
        """Count every reserved unit as in flight now, and any reserved from now on (the host is stopping)."""
        self._claimed = True
        for reservation in self._reserved:
            reservation.claim()

    def describe(self) -> str:
        """What is in flight, for a log line: ``2 HTTP requests, 1 gRPC stream`` (``nothing`` when idle)."""
        if not self._kinds:
            return "nothing"
        return ", ".join(f"{n} {kind}{'' if n == 1 else 's'}" for kind, n in sorted(self._kinds.items()))

    async def wait_idle(self) -> None:
        """Return once nothing is in flight."""
        await self._idle.wait()


@final
class Reservation:
    """Work that will start when the host begins to stop (:meth:`InflightTracker.reserve`).

    Counted from that moment, not from when its task next runs: a drain that finds nothing else in
    flight may end without yielding, and would otherwise stop the plugin before its work began.
    """

    def __init__(self, tracker: InflightTracker, kind: str) -> None:
        self._tracker = tracker
        self._kind = kind
        self._claimed = False
        self._released = False

    def claim(self) -> None:
        if not (self._claimed or self._released):
            self._claimed = True
            self._tracker.enter(self._kind)

    def release(self) -> None:
        """The work is done (or will never start): no longer counted, nor reserved."""
        if self._released:
            return
        self._released = True
        self._tracker._reserved.discard(self)
        if self._claimed:
            self._tracker.exit(self._kind)
