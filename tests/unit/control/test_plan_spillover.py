"""Spillover to the next matching cluster, removal of spilled instances first, and moving back (rebalance)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from nvcf_mono.models.cluster import Cluster, ClusterGpu, InstanceType
from nvcf_mono.models.placement import Phase, SpecPlacement
from nvcf_mono.planes.control.catalog import Capacity
from nvcf_mono.planes.control.reconcile.plan import Site, scale
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
