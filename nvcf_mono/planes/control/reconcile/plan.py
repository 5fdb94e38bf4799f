"""Pure planning of one GPU spec: time out lost requests, scale down, place up to the desired count."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

import attrs

from nvcf_mono.models.cluster import Cluster, InstanceType
from nvcf_mono.models.common import iso, new_id, parse_iso
from nvcf_mono.models.placement import LIVE, Phase, PlacedInstance, SpecPlacement
from nvcf_mono.planes.control.catalog import Capacity
from nvcf_mono.planes.control.reconcile.ledger import FailurePolicy, record_failure, remove_instance, replace_instance
from nvcf_mono.structure import evolve


@attrs.frozen(kw_only=True)
class Timeouts:
    """How long each phase may last before the reconciler gives up on it."""

    ack: float
    start: float
    terminate: float


@attrs.frozen(kw_only=True)
class Site:
    """A cluster that matches the spec, with its instance type and whether it takes work now."""

    cluster: Cluster
    instance_type: InstanceType
    placeable: bool


# Which instances go first when scaling down: those that do not serve yet, newest first.
_VICTIM_ORDER = {Phase.REQUESTED: 0, Phase.ACKNOWLEDGED: 1, Phase.STARTING: 2, Phase.RUNNING: 3}


def _age(inst: PlacedInstance, now: datetime, field: str = "updated_at") -> float:
    return (now - parse_iso(getattr(inst, field))).total_seconds()


def expire(ledger: SpecPlacement, now: datetime, timeouts: Timeouts, policy: FailurePolicy) -> SpecPlacement:
    """Give up on requests no agent took, instances that never came up, and terminations never confirmed."""
    for inst in ledger.instances:
        if inst.phase is Phase.REQUESTED and _age(inst, now, "created_at") > timeouts.ack:
            ledger = record_failure(
                ledger,
                inst,
                cause="instance-request-not-acknowledged",
                error=f"no agent of cluster {inst.cluster_name} took the request within {timeouts.ack:g}s",
                now=now,
                policy=policy,
            )
        elif inst.phase in (Phase.ACKNOWLEDGED, Phase.STARTING) and _age(inst, now, "created_at") > timeouts.start:
            ledger = record_failure(
                ledger,
                inst,
                cause="instance-start-timeout",
                error=f"not running {timeouts.start:g}s after it was requested",
                now=now,
                policy=policy,
            )
            ledger = evolve(ledger, instances=(*ledger.instances, _terminating(inst, "start-timeout", now)))
        elif inst.phase is Phase.TERMINATING and _age(inst, now) > timeouts.terminate:
            ledger = remove_instance(ledger, inst.request_id)
    return ledger


def _terminating(inst: PlacedInstance, reason: str, now: datetime) -> PlacedInstance:
    return evolve(inst, phase=Phase.TERMINATING, termination_reason=reason, published=False, updated_at=iso(now))


def _mark_terminating(ledger: SpecPlacement, inst: PlacedInstance, reason: str, now: datetime) -> SpecPlacement:
    return replace_instance(ledger, _terminating(inst, reason, now))


def terminate_all(ledger: SpecPlacement, reason: str, now: datetime) -> SpecPlacement:
    """Every live instance to TERMINATING (undeploy, ERROR, a removed spec)."""
    for inst in ledger.live():
        ledger = _mark_terminating(ledger, inst, reason, now)
    return ledger


def scale(
    ledger: SpecPlacement,
    *,
    desired: int,
    sites: Sequence[Site],
    capacity: Capacity,
    region_of: dict[str, str],
    now: datetime,
) -> SpecPlacement:
    """Bring the live count to ``desired``: terminate surplus, place what is missing where it fits."""
    live = list(ledger.live())
    if len(live) > desired:
        newest_first = sorted(live, key=lambda i: i.created_at, reverse=True)
        victims = sorted(newest_first, key=lambda i: _VICTIM_ORDER[i.phase])  # stable: newest first per phase
        for inst in victims[: len(live) - desired]:
            ledger = _mark_terminating(ledger, inst, "scale-down", now)
        return evolve(ledger, desired=desired, waiting=0, waiting_reason=None, updated_at=iso(now))
    missing = desired - len(live)
    if missing == 0:
        if ledger.desired == desired and ledger.waiting == 0:
            return ledger
        return evolve(ledger, desired=desired, waiting=0, waiting_reason=None, updated_at=iso(now))
    if ledger.retry_after is not None and parse_iso(ledger.retry_after) > now:
        backoff = f"replacing failed instances after {ledger.retry_after} (backoff)"
        if ledger.waiting == missing and ledger.waiting_reason == backoff and ledger.desired == desired:
            return ledger
        return evolve(ledger, desired=desired, waiting=missing, waiting_reason=backoff, updated_at=iso(now))
    added: list[PlacedInstance] = []
    for _ in range(missing):
        site = next((s for s in sites if s.placeable and capacity.fits(s.cluster, _gpu(s), s.instance_type)), None)
        if site is None:
            break
        gpu = _gpu(site)
        capacity.take(site.cluster.cluster_id, gpu, site.instance_type.name, site.instance_type.gpu_count)
        stamp = iso(now)
        added.append(
            PlacedInstance(
                request_id=new_id(),
                cluster_id=site.cluster.cluster_id,
                cluster_name=site.cluster.cluster_name,
                backend=site.cluster.cluster_group_name,
                region=region_of.get(site.cluster.cluster_id, site.cluster.region),
                gpu=gpu,
                instance_type=site.instance_type.name,
                gpu_count=site.instance_type.gpu_count,
                phase=Phase.REQUESTED,
                created_at=stamp,
                updated_at=stamp,
            )
        )
    waiting = missing - len(added)
    reason = None if waiting == 0 else _why_waiting(sites, waiting)
    if not added and ledger.waiting == waiting and ledger.waiting_reason == reason and ledger.desired == desired:
        return ledger
    return evolve(
        ledger,
        instances=(*ledger.instances, *added),
        desired=desired,
        waiting=waiting,
        waiting_reason=reason,
        updated_at=iso(now),
    )


def _gpu(site: Site) -> str:
    for gpu in site.cluster.gpus:
        if any(it.name == site.instance_type.name for it in gpu.instance_types):
            return gpu.name
    return site.instance_type.value.rsplit(".", 1)[-1]


def _why_waiting(sites: Sequence[Site], waiting: int) -> str:
    if not sites:
        return f"{waiting} instance(s) wait: no registered cluster matches the specification"
    if not any(s.placeable for s in sites):
        names = ", ".join(sorted({s.cluster.cluster_name for s in sites}))
        return f"{waiting} instance(s) wait: no matching cluster is healthy ({names})"
    it = sites[0].instance_type.name
    return f"{waiting} instance(s) wait for capacity: no matching cluster has room for another {it}"


def live_count(ledger: SpecPlacement | None) -> int:
    return 0 if ledger is None else sum(1 for i in ledger.instances if i.phase in LIVE)


def expire_after(now: datetime, seconds: float) -> str:
    return iso(now + timedelta(seconds=seconds))
