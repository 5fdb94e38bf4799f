"""Why a queued request is still waiting (``NVCF-WAIT-REASON``, and the queue API's ``waitReason``),
read from its version's placements.

``queued``: an instance runs and the request waits for a free slot. ``cold_starting``: no instance
runs yet and one is being started (or is about to be: the autoscaler was woken). ``no_capacity``:
no cluster can place an instance. ``instance_failing``: the version's instances keep failing.
"""

from __future__ import annotations

from collections.abc import Sequence

from nvcf_mono.models.placement import LIVE, Phase, SpecPlacement

QUEUED = "queued"
COLD_STARTING = "cold_starting"
NO_CAPACITY = "no_capacity"
INSTANCE_FAILING = "instance_failing"


def wait_reason(placements: Sequence[SpecPlacement]) -> str:
    if any(i.phase is Phase.RUNNING for p in placements for i in p.instances):
        return QUEUED
    if any(p.consecutive_failures > 0 for p in placements):
        return INSTANCE_FAILING
    starting = any(i.phase in LIVE for p in placements for i in p.instances)
    if not starting and any(p.waiting > 0 and p.retry_after is None for p in placements):
        return NO_CAPACITY
    return COLD_STARTING
