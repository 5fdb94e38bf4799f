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
#: Upper bounds (ms) of the latency buckets a report counts answers in; one more bucket holds the rest.
LATENCY_BOUNDS_MS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000, 300000)


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
    #: Invocations this node answered with a status of 400 or more (the client's hang-up, 499, too).
    errors: int = 0
    #: How many answers took up to each of LATENCY_BOUNDS_MS, and more (empty: none answered).
    latency: tuple[int, ...] = ()


@wire
class LoadReport(WireModel):
    """A node's report (sent every ``load_report_interval``; versions with nothing to say are left out)."""

    node: str
    at: float  # unix seconds
    interval: float
    versions: tuple[VersionLoad, ...] = ()
