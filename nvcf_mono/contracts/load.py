"""What invocation nodes tell the autoscaler: load per function version, and wake-ups at zero.

Reports are core NATS messages (at most once, no history): a lost report costs one sample, and
whichever control-plane process leads next has been listening all along. A wake is sent when a
request is queued for a version that has no running instance, so scaling from zero does not wait
for the autoscaler's next round; the round itself, which sees the queue, is the backstop.
"""

from __future__ import annotations

from nvcf_mono.structure import WireModel, wire

LOAD_ALL = "nvcf.load.>"
WAKE_ALL = "nvcf.wake.>"


def load_subject(node: str) -> str:
    """``nvcf.load.<node>``: one node's periodic report."""
    return f"nvcf.load.{node.replace('.', '_')}"


def wake_subject(function_version_id: str) -> str:
    """``nvcf.wake.<fvid>``: a request waits for a version with no running instance."""
    return f"nvcf.wake.{function_version_id}"


@wire
class InstanceLoad(WireModel):
    """One connected worker: requests it holds and how many it may hold."""

    instance_id: str
    in_flight: int
    slots: int
    ready: bool = True


@wire
class VersionLoad(WireModel):
    """One version's load on one node since the node's previous report.

    ``busy_seconds / slot_seconds`` is the fraction of worker slots busy over the interval
    (NVCF's ``worker_thread_busy_seconds`` over its thread count).
    """

    function_id: str
    function_version_id: str
    busy_seconds: float
    slot_seconds: float
    invocations: int = 0
    instances: tuple[InstanceLoad, ...] = ()


@wire
class LoadReport(WireModel):
    """A node's report (sent every ``load_report_interval``; versions with nothing to say are left out)."""

    node: str
    at: float  # unix seconds
    interval: float
    versions: tuple[VersionLoad, ...] = ()
