"""Small lifecycle pieces the host and plugins share: plugin states and the in-flight work tracker."""

from __future__ import annotations

import enum
from collections.abc import Iterator
from contextlib import contextmanager
from typing import final

import anyio


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
    """Counts work in progress (HTTP requests, gRPC calls, plugin jobs) so shutdown can wait for it."""

    def __init__(self) -> None:
        self._count = 0
        self._idle = anyio.Event()
        self._idle.set()

    @property
    def count(self) -> int:
        """Units of work in progress now."""
        return self._count

    def enter(self) -> None:
        """One more unit of work started."""
        if self._count == 0:
            self._idle = anyio.Event()
        self._count += 1

    def exit(self) -> None:
        """One unit of work finished."""
        self._count -= 1
        if self._count == 0:
            self._idle.set()

    @contextmanager
    def track(self) -> Iterator[None]:
        """Count the enclosed block as in-flight work."""
        self.enter()
        try:
            yield
        finally:
            self.exit()

    async def wait_idle(self) -> None:
        """Return once nothing is in flight."""
        await self._idle.wait()
