"""Holding a JetStream delivery until its consumer can take it.

An instance that pauses (its inference server restarting) usually has a pull waiting, so the
next delivery reaches it anyway. Handing that back with a nak would count as a delivery, and the
paused consumer's own waiting pull would fetch it straight back; keeping it (in progress) for a
short while serves it as soon as the instance is back, which is usually sooner.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import anyio

from nvcf_mono.bus.errors import BusError

if TYPE_CHECKING:
    from nvcf_mono.bus.api import Delivery


async def hold_until_ready(
    ready: Callable[[], anyio.Event], delivery: Delivery, *, within: float, keepalive: float
) -> bool:
    """Keep ``delivery`` in progress until ``ready()`` is set; False after ``within`` seconds.

    ``ready`` is called each time, as owners replace their events when readiness is lost.
    """
    with anyio.move_on_after(within):
        while True:
            with anyio.move_on_after(keepalive):
                await ready().wait()
                return True
            try:
                await delivery.in_progress()
            except BusError:
                return False
    return False
