"""``lose``: which instances go with a cluster whose agent is gone."""

from __future__ import annotations

from datetime import UTC, datetime

from nvcf_mono.models.placement import Phase, PlacedInstance, SpecPlacement
from nvcf_mono.planes.control.reconcile.plan import lose
from nvcf_mono.structure import evolve

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
T = "2026-01-01T11:00:00.000Z"


def _instance(iid: str, phase: Phase, cluster_id: str = "gone") -> PlacedInstance:
    return PlacedInstance(
        request_id=f"r-{iid}",
        cluster_id=cluster_id,
        cluster_name=cluster_id,
        backend="group",
        region="ncp",
        gpu="H100",
        instance_type="ON-PREM.GPU.H100_1x",
        gpu_count=1,
        phase=phase,
        created_at=T,
        updated_at=T,
        instance_id=iid,
    )


def _ledger(*instances: PlacedInstance) -> SpecPlacement:
    return SpecPlacement(
        function_id="fn",
        function_version_id="fv",
        deployment_id="d",
        gpu_specification_id="g",
        nca_id="nca",
        updated_at=T,
        instances=instances,
        desired=len(instances),
    )


def test_only_live_instances_of_lost_clusters_without_a_serving_worker_go() -> None:
    running, starting = _instance("running", Phase.RUNNING), _instance("starting", Phase.STARTING)
    acked = _instance("acked", Phase.ACKNOWLEDGED)
    serving = _instance("serving", Phase.RUNNING)
    requested, terminating = _instance("requested", Phase.REQUESTED), _instance("terminating", Phase.TERMINATING)
    elsewhere = _instance("elsewhere", Phase.RUNNING, cluster_id="alive")
    ledger = _ledger(running, starting, acked, serving, requested, terminating, elsewhere)

    out, lost = lose(ledger, frozenset({"gone"}), frozenset({"serving"}), NOW)

    assert [i.instance_id for i in lost] == ["running", "starting", "acked"]
    assert [i.instance_id for i in out.instances] == ["serving", "requested", "terminating", "elsewhere"]
    # Not failures of the function: nothing counted, nothing to wait for before the replacement.
    assert (out.total_failures, out.consecutive_failures, out.retry_after, out.failures) == (0, 0, None, ())


def test_nothing_lost_leaves_the_ledger_as_it_was() -> None:
    ledger = _ledger(_instance("running", Phase.RUNNING))
    assert lose(ledger, frozenset(), frozenset(), NOW) == (ledger, ())
    assert lose(ledger, frozenset({"other"}), frozenset(), NOW) == (ledger, ())
    kept = evolve(ledger, instances=(_instance("running", Phase.RUNNING),))
    assert lose(kept, frozenset({"gone"}), frozenset({"running"}), NOW) == (kept, ())
