"""``lose``: which instances go with a cluster whose agent is gone."""

from __future__ import annotations

from datetime import UTC, datetime

from nvcf_mono.models.placement import Phase, PlacedInstance
from nvcf_mono.planes.control.reconcile.plan import lose
from tests.support.placements import ledger, placed

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
#: Phases of instances that exist (or are being started) on their cluster.
_LIVE = (("running", Phase.RUNNING), ("starting", Phase.STARTING), ("acked", Phase.ACKNOWLEDGED))


def _on_gone(instance_id: str, phase: Phase) -> PlacedInstance:
    return placed(instance_id, phase, cluster_id="gone")


def test_only_live_instances_of_lost_clusters_without_a_serving_worker_go() -> None:
    running, starting, acked = (_on_gone(n, p) for n, p in _LIVE)
    serving = _on_gone("serving", Phase.RUNNING)
    requested, terminating = _on_gone("requested", Phase.REQUESTED), _on_gone("terminating", Phase.TERMINATING)
    elsewhere = placed("elsewhere", Phase.RUNNING, cluster_id="alive")
    held = ledger(running, starting, acked, serving, requested, terminating, elsewhere)

    out, lost = lose(held, frozenset({"gone"}), frozenset({"serving"}), NOW)

    assert [i.instance_id for i in lost] == ["running", "starting", "acked"]
    assert [i.instance_id for i in out.instances] == ["serving", "requested", "terminating", "elsewhere"]
    # Not failures of the function: nothing counted, nothing to wait for before the replacement.
    assert (out.total_failures, out.consecutive_failures, out.retry_after, out.failures) == (0, 0, None, ())


def test_nothing_lost_leaves_the_ledger_as_it_was() -> None:
    held = ledger(_on_gone("running", Phase.RUNNING))
    assert lose(held, frozenset(), frozenset(), NOW) == (held, ())
    assert lose(held, frozenset({"other"}), frozenset(), NOW) == (held, ())
    assert lose(held, frozenset({"gone"}), frozenset({"running"}), NOW) == (held, ())
