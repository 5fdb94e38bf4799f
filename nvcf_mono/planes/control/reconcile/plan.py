"""Pure planning of one GPU spec: time out lost requests, scale down, place up to the desired count."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

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


# Which instances go first when scaling down: idle running ones (newest first), then those not
# serving yet (a starting instance is about to serve), and those with requests in flight last.
_VICTIM_ORDER = {Phase.RUNNING: 0, Phase.REQUESTED: 1, Phase.ACKNOWLEDGED: 2, Phase.STARTING: 3}
_BUSY = 4


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


def lose(
    ledger: SpecPlacement, lost_clusters: frozenset[str], serving: frozenset[str], now: datetime
) -> tuple[SpecPlacement, tuple[PlacedInstance, ...]]:
    """Forget the instances of clusters whose agents are gone, but for those whose worker still serves.

    Nothing can report, stop or vouch for them; the agent of a cluster that comes back stops what the
    ledger no longer holds. No failure of the function's is recorded, so the replacement waits for nothing.
    """
    lost = tuple(
        i
        for i in ledger.instances
        if i.cluster_id in lost_clusters
        and i.phase not in (Phase.REQUESTED, Phase.TERMINATING)  # their own timeouts apply
        and (i.instance_id or "") not in serving
    )
    for inst in lost:
        ledger = remove_instance(ledger, inst.request_id)
    return (evolve(ledger, updated_at=iso(now)) if lost else ledger), lost


def _terminating(inst: PlacedInstance, reason: str, now: datetime) -> PlacedInstance:
    return evolve(inst, phase=Phase.TERMINATING, termination_reason=reason, published=False, updated_at=iso(now))


def _mark_terminating(ledger: SpecPlacement, inst: PlacedInstance, reason: str, now: datetime) -> SpecPlacement:
    return replace_instance(ledger, _terminating(inst, reason, now))


def terminate_instance(ledger: SpecPlacement, instance_id: str, reason: str, now: datetime) -> SpecPlacement | None:
    """One live instance to TERMINATING (the next round replaces it if still needed); None if not live here."""
    for inst in ledger.live():
        if inst.instance_id == instance_id:
            return _mark_terminating(ledger, inst, reason, now)
    return None


def mark_rollover(ledger: SpecPlacement, count: int, now: datetime) -> tuple[SpecPlacement, int]:
    """Up to ``count`` live instances, oldest first, to be replaced by new ones (one at a time, each new one
    running before its old one goes); returns the ledger and how many were marked.
    """
    candidates = sorted(
        (i for i in ledger.live() if not i.rollover and i.replaces is None), key=lambda i: (i.created_at, i.request_id)
    )
    chosen = candidates[:count]
    for inst in chosen:
        ledger = replace_instance(ledger, evolve(inst, rollover=True, updated_at=iso(now)))
    return ledger, len(chosen)


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
    busy: frozenset[str] = frozenset(),
    rebalance: bool = False,
) -> SpecPlacement:
    """Bring the live count to ``desired``: terminate surplus, place what is missing where it fits.

    ``sites`` come preferred first: placement takes the first with room (spilling over to the next),
    and scaling down removes instances on the least preferred first. ``busy``: instance ids with
    requests in flight, removed only when nothing else is left. ``rebalance``: with nothing else to
    do, start an instance on a more preferred site that has room again, and remove the spilled-over
    one it replaces once it runs.
    """
    rank = _ranks(sites)
    ledger = _settle_moves(ledger, now)
    moving = [i for i in ledger.live() if i.replaces is not None]
    live = [i for i in ledger.live() if i.replaces is None]
    if len(live) > desired:
        for inst in moving:  # shrinking: a move in progress is not worth finishing
            ledger = _mark_terminating(ledger, inst, "rebalance-cancelled", now)
        newest_first = sorted(live, key=lambda i: i.created_at, reverse=True)
        victims = sorted(  # stable: newest first within each rank
            newest_first,
            key=lambda i: (
                _BUSY if i.instance_id in busy else _VICTIM_ORDER[i.phase],
                -rank.get(i.cluster_id, len(sites)),
            ),
        )
        for inst in victims[: len(live) - desired]:
            ledger = _mark_terminating(ledger, inst, "scale-down", now)
        return evolve(ledger, desired=desired, waiting=0, waiting_reason=None, updated_at=iso(now))
    missing = desired - len(live)
    if missing == 0:
        rolling = [i for i in live if i.rollover]
        backing_off = ledger.retry_after is not None and parse_iso(ledger.retry_after) > now
        if rolling and not moving and not backing_off:
            return _roll_over(ledger, rolling, sites=sites, capacity=capacity, region_of=region_of, now=now)
        if rebalance and not moving:
            ledger = _move_back(
                ledger, live=live, sites=sites, rank=rank, capacity=capacity, region_of=region_of, now=now
            )
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
        added.append(_place(site, capacity, region_of, now))
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


def _place(
    site: Site, capacity: Capacity, region_of: dict[str, str], now: datetime, replaces: str | None = None
) -> PlacedInstance:
    gpu = _gpu(site)
    capacity.take(site.cluster.cluster_id, gpu, site.instance_type.name, site.instance_type.gpu_count)
    stamp = iso(now)
    return PlacedInstance(
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
        replaces=replaces,
    )


def _ranks(sites: Sequence[Site]) -> dict[str, int]:
    """Preference of each cluster (0: most preferred)."""
    rank: dict[str, int] = {}
    for i, site in enumerate(sites):
        rank.setdefault(site.cluster.cluster_id, i)
    return rank


def _settle_moves(ledger: SpecPlacement, now: datetime) -> SpecPlacement:
    """A replacement that runs retires the instance it replaces; one whose target is gone is an ordinary one."""
    for inst in ledger.live():
        if inst.replaces is None:
            continue
        old = ledger.find(inst.replaces)
        if old is None or old.phase not in LIVE:
            ledger = replace_instance(ledger, evolve(inst, replaces=None))
        elif inst.phase is Phase.RUNNING:
            ledger = _mark_terminating(ledger, old, "rollover" if old.rollover else "rebalance", now)
            ledger = replace_instance(ledger, evolve(inst, replaces=None, updated_at=iso(now)))
    return ledger


def _roll_over(
    ledger: SpecPlacement,
    rolling: Sequence[PlacedInstance],
    *,
    sites: Sequence[Site],
    capacity: Capacity,
    region_of: dict[str, str],
    now: datetime,
) -> SpecPlacement:
    """The oldest instance marked for a rollover gets its replacement, on the most preferred site with room;
    where none has room for one more, it goes first and the next round places its successor.
    """
    oldest = min(rolling, key=lambda i: (i.created_at, i.request_id))
    site = next((s for s in sites if s.placeable and capacity.fits(s.cluster, _gpu(s), s.instance_type)), None)
    if site is None:
        return _mark_terminating(ledger, oldest, "rollover", now)
    successor = _place(site, capacity, region_of, now, replaces=oldest.request_id)
    return evolve(ledger, instances=(*ledger.instances, successor), updated_at=iso(now))


def _move_back(
    ledger: SpecPlacement,
    *,
    live: Sequence[PlacedInstance],
    sites: Sequence[Site],
    rank: dict[str, int],
    capacity: Capacity,
    region_of: dict[str, str],
    now: datetime,
) -> SpecPlacement:
    """One move at a time: the running instance on the least preferred cluster, to a better one with room."""
    running = [i for i in live if i.phase is Phase.RUNNING]
    if not running or any(i.phase is not Phase.RUNNING for i in live):
        return ledger
    worst = max(running, key=lambda i: rank.get(i.cluster_id, len(sites)))
    worst_rank = rank.get(worst.cluster_id, len(sites))
    for i, site in enumerate(sites):
        if i >= worst_rank:
            break
        if site.placeable and capacity.fits(site.cluster, _gpu(site), site.instance_type):
            moved = _place(site, capacity, region_of, now, replaces=worst.request_id)
            return evolve(ledger, instances=(*ledger.instances, moved), updated_at=iso(now))
    return ledger


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
