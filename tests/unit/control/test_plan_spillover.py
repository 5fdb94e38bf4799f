"""Spillover to the next matching cluster, removal of spilled instances first, moving back (rebalance), and
rollovers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from nvcf_mono.models.cluster import Cluster, ClusterGpu, InstanceType
from nvcf_mono.models.placement import Phase, SpecPlacement
from nvcf_mono.planes.control.catalog import Capacity
from nvcf_mono.planes.control.reconcile.plan import Site, mark_rollover, scale
from nvcf_mono.structure import evolve

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
IT = InstanceType(name="ON-PREM.GPU.H100_1x", value="ON-PREM.GPU.H100", gpu_count=1, max_instances=8)


def _cluster(name: str, gpus: int) -> Cluster:
    return Cluster(
        cluster_id=f"id-{name}",
        cluster_name=name,
        cluster_group_name=name,
        cluster_group_id=f"g-{name}",
        nca_id="nca",
        region="local",
        cloud_provider="ON-PREM",
        gpus=(ClusterGpu(name="H100", capacity=gpus, instance_types=(IT,)),),
        registered_at="2026-01-01T00:00:00.000Z",
    )


PREFERRED, SPARE = _cluster("preferred", 1), _cluster("spare", 8)
SITES = [Site(cluster=c, instance_type=IT, placeable=True) for c in (PREFERRED, SPARE)]


def _empty() -> SpecPlacement:
    return SpecPlacement(
        function_id="f", function_version_id="v", deployment_id="d", gpu_specification_id="g", nca_id="nca",
        updated_at="2026-01-01T00:00:00.000Z",
    )  # fmt: skip


def _run(ledger: SpecPlacement, desired: int, *, rebalance: bool = False, at: datetime = NOW) -> SpecPlacement:
    others = Capacity.from_ledgers([ledger])
    return scale(ledger, desired=desired, sites=SITES, capacity=others, region_of={}, now=at, rebalance=rebalance)


def _running(ledger: SpecPlacement) -> SpecPlacement:
    """Every requested instance has come up."""
    return evolve(
        ledger,
        instances=tuple(evolve(i, phase=Phase.RUNNING) if i.phase is Phase.REQUESTED else i for i in ledger.instances),
    )


def _where(ledger: SpecPlacement) -> list[tuple[str, Phase]]:
    return sorted((i.cluster_name, i.phase) for i in ledger.instances)


def test_a_full_preferred_cluster_spills_over_to_the_next() -> None:
    out = _running(_run(_empty(), 3))
    assert _where(out) == [("preferred", Phase.RUNNING), ("spare", Phase.RUNNING), ("spare", Phase.RUNNING)]
    # Scaling down removes spilled-over instances first.
    down = _run(out, 1)
    assert [i.cluster_name for i in down.live()] == ["preferred"]


def test_without_rebalance_spilled_instances_stay() -> None:
    ledger = _running(_run(_empty(), 2))
    freed = evolve(ledger, instances=tuple(i for i in ledger.instances if i.cluster_name == "spare"))
    # The preferred cluster has room again (its instance went away); without rebalance nothing moves.
    assert _where(_run(freed, 1)) == [("spare", Phase.RUNNING)]


def test_rebalance_starts_on_the_preferred_cluster_first_then_retires_the_spilled_one() -> None:
    ledger = _running(_run(_empty(), 2))
    spilled = next(i for i in ledger.instances if i.cluster_name == "spare")
    freed = evolve(ledger, instances=(spilled,), desired=1)
    moving = _run(freed, 1, rebalance=True)
    # A replacement on the preferred cluster; the spilled instance keeps serving meanwhile.
    assert _where(moving) == [("preferred", Phase.REQUESTED), ("spare", Phase.RUNNING)]
    (replacement,) = [i for i in moving.instances if i.cluster_name == "preferred"]
    assert replacement.replaces == spilled.request_id
    # Not running yet: nothing changes, and no second move starts.
    assert _where(_run(moving, 1, rebalance=True)) == _where(moving)
    done = _run(_running(moving), 1, rebalance=True, at=NOW + timedelta(seconds=5))
    assert _where(done) == [("preferred", Phase.RUNNING), ("spare", Phase.TERMINATING)]
    retired = next(i for i in done.instances if i.cluster_name == "spare")
    assert retired.termination_reason == "rebalance"
    assert all(i.replaces is None for i in done.instances)


def test_a_move_is_cancelled_when_the_spec_shrinks() -> None:
    ledger = _running(_run(_empty(), 2))
    spilled = next(i for i in ledger.instances if i.cluster_name == "spare")
    moving = _run(evolve(ledger, instances=(spilled,), desired=1), 1, rebalance=True)
    out = _run(moving, 0, rebalance=True)
    assert [i.phase for i in out.instances] == [Phase.TERMINATING, Phase.TERMINATING]
    assert {i.termination_reason for i in out.instances} == {"scale-down", "rebalance-cancelled"}


def _stamped(ledger: SpecPlacement) -> SpecPlacement:
    """Distinct creation times, in the order the instances were placed."""
    return evolve(
        ledger,
        instances=tuple(
            evolve(i, created_at=(NOW + timedelta(seconds=n)).isoformat()) for n, i in enumerate(ledger.instances)
        ),
    )


def test_a_rollover_replaces_the_oldest_first_each_new_one_running_before_its_old_one_goes() -> None:
    ledger = _stamped(_running(_run(_empty(), 2)))
    oldest, newest = ledger.instances
    marked, count = mark_rollover(ledger, 5, NOW)
    assert count == 2 and all(i.rollover for i in marked.instances)
    assert mark_rollover(marked, 1, NOW)[1] == 0  # already marked: not counted again

    step = _run(marked, 2)
    (successor,) = [i for i in step.instances if i.phase is Phase.REQUESTED]
    assert successor.replaces == oldest.request_id and not successor.rollover
    assert _run(step, 2) == step  # one at a time: nothing more while it starts
    done = _run(_running(step), 2)
    old = next(i for i in done.instances if i.request_id == oldest.request_id)
    assert old.phase is Phase.TERMINATING and old.termination_reason == "rollover"
    # The next round replaces the other one.
    nxt = _run(done, 2)
    assert any(i.replaces == newest.request_id for i in nxt.instances)


def test_a_rollover_without_room_for_one_more_retires_the_old_one_first() -> None:
    full = [Site(cluster=_cluster("only", 1), instance_type=IT, placeable=True)]
    ledger = _running(scale(_empty(), desired=1, sites=full, capacity=Capacity(), region_of={}, now=NOW))
    marked, _ = mark_rollover(ledger, 1, NOW)
    out = scale(marked, desired=1, sites=full, capacity=Capacity.from_ledgers([marked]), region_of={}, now=NOW)
    assert [(i.phase, i.termination_reason) for i in out.instances] == [(Phase.TERMINATING, "rollover")]
    # Once it is gone (its GPU free again), the usual scale-up places its successor.
    gone = evolve(out, instances=())
    again = scale(gone, desired=1, sites=full, capacity=Capacity.from_ledgers([gone]), region_of={}, now=NOW)
    assert [i.phase for i in again.live()] == [Phase.REQUESTED]
