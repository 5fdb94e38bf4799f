"""Delays between retries: doubling from an initial pause up to a maximum, with jitter.

The one backoff of the project: reconnecting workers, republishing to a stream whose leader moved,
storing a result while the store is full, restarting a child process.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import final


@final
class Backoff:
    """Delays between attempts: doubling from ``initial`` up to ``maximum``, each within ``jitter`` of it."""

    def __init__(
        self,
        initial: float = 0.2,
        maximum: float = 10.0,
        *,
        factor: float = 2.0,
        jitter: float = 0.2,
        rand: Callable[[float, float], float] = random.uniform,
    ) -> None:
        self.initial = initial
        self.maximum = maximum
        self.factor = factor
        self.jitter = jitter
        self._rand = rand
        self._next = initial

    def next(self) -> float:
        """The delay before the next attempt (the one after is longer, up to ``maximum``)."""
        delay = self._next
        self._next = min(self._next * self.factor, self.maximum)
        return delay * self._rand(1 - self.jitter, 1 + self.jitter)

    def reset(self) -> None:
        self._next = self.initial
