"""Registered clusters seen from a deployment: which GPUs, instance types and backends exist, which
clusters match a GPU spec, whether they are healthy, and how much room they have left.

The control plane is the capacity authority: room = registered capacity minus what its own ledgers
have placed there, so two specs never count the same GPUs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import timedelta

import attrs

from nvcf_mono.http.problem import ProblemError
from nvcf_mono.models.cluster import Cluster, ClusterHeartbeat, ClusterStatus, InstanceType, parse_instance_type
from nvcf_mono.models.common import duration_seconds, parse_iso, utc_now
from nvcf_mono.models.deployment import AutoscalingConfiguration, GpuSpec
from nvcf_mono.models.function import FunctionVersion
from nvcf_mono.models.placement import LIVE, Phase, SpecPlacement
from nvcf_mono.models.task import TERMINAL as TASK_TERMINAL
from nvcf_mono.models.task import Task
from nvcf_mono.structure import evolve

HELM_CAPABILITY = "HelmMiniService"


def visible_clusters(clusters: Iterable[Cluster], account: str) -> list[Cluster]:
    """Clusters an account may deploy on: its own, ones authorized for it, and shared ones (``*``)."""
    return [
        c for c in clusters if c.nca_id == account or account in c.authorized_nca_ids or "*" in c.authorized_nca_ids
    ]


def is_heard(heartbeat: ClusterHeartbeat | None, ttl: float) -> bool:
    """A recent heartbeat, healthy or not: the cluster's agent is there (the bucket also expires stale ones)."""
    return heartbeat is not None and utc_now() - parse_iso(heartbeat.at) <= timedelta(seconds=ttl)


def is_healthy(heartbeat: ClusterHeartbeat | None, ttl: float) -> bool:
    """A recent healthy heartbeat, with no maintenance mode: the cluster takes new instances."""
    return heartbeat is not None and heartbeat.healthy and is_heard(heartbeat, ttl)


def health_of(heartbeat: ClusterHeartbeat | None, ttl: float) -> tuple[str, str | None]:
    """What a cluster's views say of it: its agent's own ``healthy``/``unhealthy`` while it is heard
    (else ``unhealthy``), and its maintenance mode (``None``, ``CordonOnly``, ...; None when not heard).

    A cordoned cluster is healthy and takes no new work: two facts, not one "unhealthy".
    """
    if heartbeat is None or not is_heard(heartbeat, ttl):
        return "unhealthy", None
    status = "healthy" if heartbeat.status.lower() == "healthy" else "unhealthy"
    return status, heartbeat.maintenance_mode.value


def _bad(detail: str) -> ProblemError:
    return ProblemError(400, detail)


def _matches_hints(spec: GpuSpec, it: InstanceType) -> bool:
    for wanted, have in (
        (spec.cpu_arch, it.cpu_arch),
        (spec.os, it.os),
        (spec.driver_version, it.driver_version),
    ):
        if wanted is not None and have is not None and wanted.lower() != have.lower():
            return False
    return True


def candidates(clusters: Iterable[Cluster], spec: GpuSpec) -> list[tuple[Cluster, InstanceType]]:
    """Clusters (with the instance type) that satisfy a spec's placement constraints, preferred first."""
    out = []
    names = {n.lower() for n in (spec.clusters or ()) + (spec.availability_zones or ())}
    regions = {r.lower() for r in spec.regions or ()}
    for cluster in clusters:
        if spec.backend is not None and cluster.cluster_group_name.lower() != spec.backend.lower():
            continue
        if names and cluster.cluster_name.lower() not in names and cluster.cluster_id.lower() not in names:
            continue
        if regions and cluster.region.lower() not in regions:
            continue
        if spec.attributes and not cluster.has_attributes(spec.attributes):
            continue
        it = cluster.instance_type(spec.gpu, spec.instance_type)
        if it is None or not _matches_hints(spec, it):
            continue
        out.append((cluster, it))
    if spec.clusters:
        order = {n.lower(): i for i, n in enumerate(spec.clusters)}
        out.sort(key=lambda pair: order.get(pair[0].cluster_name.lower(), order.get(pair[0].cluster_id.lower(), 99)))
    return out


def check_placement(
    clusters: Iterable[Cluster], account: str, spec: GpuSpec
) -> tuple[GpuSpec, list[tuple[Cluster, InstanceType]]]:
    """Where a spec (a deployment's or a task's) may run: 400 unless a registered cluster the account may
    use offers its GPU and instance type; the spec with names in their registered spelling, and the sites.
    """
    if spec.backend is not None and spec.clusters:
        raise _bad("Cannot specify both 'backend' and 'clusters'")
    mine = visible_clusters(clusters, account)
    if not mine:
        raise _bad(f"No backends are available to account '{account}': no cluster agent has registered yet")
    if spec.backend is not None and not any(c.cluster_group_name.lower() == spec.backend.lower() for c in mine):
        raise _bad(f"Invalid Backend '{spec.backend}' specified")
    for name in spec.clusters or ():
        if not any(name.lower() in (c.cluster_name.lower(), c.cluster_id.lower()) for c in mine):
            raise _bad(f"Invalid cluster '{name}' specified")
    gpu_names = {g.name.upper(): g.name for c in mine for g in c.gpus}
    gpu = gpu_names.get(spec.gpu.upper())
    if gpu is None:
        raise _bad(f"Invalid GPU '{spec.gpu}' specified")
    parsed = parse_instance_type(spec.instance_type)
    types = {
        it.name.upper(): it.name
        for c in mine
        for g in c.gpus
        if g.name.upper() == gpu.upper()
        for it in g.instance_types
    }
    instance_type = types.get(spec.instance_type.upper())
    if instance_type is None or (parsed is not None and parsed.gpu != gpu.upper()):
        raise _bad(f"Invalid InstanceType '{spec.instance_type}' specified")
    normalized = evolve(spec, gpu=gpu, instance_type=instance_type, placement=None)
    matching = candidates(mine, normalized)
    if not matching:
        raise _bad(
            f"No registered cluster offers {instance_type} with backend={spec.backend}, clusters={spec.clusters}, "
            f"regions={spec.regions}, attributes={spec.attributes}"
        )
    return normalized, matching


def check_autoscaling(config: AutoscalingConfiguration | None) -> None:
    if config is None:
        return
    up, down = config.scale_up_details, config.scale_down_details
    if up is not None and up.factor <= 1:
        raise _bad("autoscalingConfiguration.scaleUpDetails.factor must be greater than 1")
    if down is not None and not 0 < down.factor < 1:
        raise _bad("autoscalingConfiguration.scaleDownDetails.factor must be between 0 and 1")
    for details in (up, down):
        if details is not None and details.stickiness is not None:
            size = duration_seconds(details.stickiness.size)  # at most PT1H (the field's check)
            if duration_seconds(details.stickiness.threshold) >= size:
                raise _bad("autoscaling stickiness.threshold must be less than stickiness.size")


def check_spec(clusters: list[Cluster], account: str, spec: GpuSpec, fv: FunctionVersion) -> GpuSpec:
    """Validate a spec against what is registered; returns it with names in their registered spelling."""
    if spec.backend is not None and spec.clusters:
        raise _bad("Cannot specify both 'backend' and 'clusters'")
    if spec.min_instances > spec.max_instances:
        raise _bad("'minInstances' must be lesser than or equal to 'maxInstances'")
    if not fv.is_helm:
        if spec.configuration is not None:
            raise _bad("'configuration' may only be given for a Helm function")
        if spec.helm_validation_policy is not None:
            raise _bad("'helmValidationPolicy' may only be given for a Helm function")
    check_autoscaling(spec.autoscaling_configuration)
    normalized, matching = check_placement(clusters, account, spec)
    if fv.is_helm and not any(HELM_CAPABILITY in c.capabilities for c, _ in matching):
        raise _bad(
            "Helm functions need a cluster whose agent installs Helm charts (the Kubernetes backend, capability "
            f"'{HELM_CAPABILITY}'); the matching clusters ({', '.join(c.cluster_name for c, _ in matching)}) "
            "run container functions only"
        )
    return normalized


@attrs.define
class Capacity:
    """Room left per (cluster, GPU) and per (cluster, instance type), from the ledgers."""

    gpus_used: dict[tuple[str, str], int] = attrs.field(factory=dict)
    instances_used: dict[tuple[str, str], int] = attrs.field(factory=dict)

    @classmethod
    def from_ledgers(cls, ledgers: Iterable[SpecPlacement]) -> Capacity:
        cap = cls()
        for ledger in ledgers:
            for inst in ledger.instances:
                if inst.phase in LIVE or inst.phase is Phase.TERMINATING:
                    cap.take(inst.cluster_id, inst.gpu, inst.instance_type, inst.gpu_count)
        return cap

    def take_tasks(self, tasks: Iterable[Task], clusters: Mapping[str, Cluster]) -> None:
        """What unfinished tasks hold (their instance runs, or is about to, on the cluster they were sent to)."""
        for task in tasks:
            cluster = clusters.get(task.cluster_id or "")
            ended = task.status in TASK_TERMINAL and (not task.instances or task.instance_gone)
            if cluster is None or ended:
                continue
            spec = task.gpu_specification
            held = cluster.instance_type(spec.gpu, spec.instance_type)
            if held is not None:
                self.take(cluster.cluster_id, spec.gpu, held.name, held.gpu_count)

    def take(self, cluster_id: str, gpu: str, instance_type: str, gpu_count: int) -> None:
        key = (cluster_id, gpu.upper())
        self.gpus_used[key] = self.gpus_used.get(key, 0) + gpu_count
        ikey = (cluster_id, instance_type.upper())
        self.instances_used[ikey] = self.instances_used.get(ikey, 0) + 1

    def fits(self, cluster: Cluster, gpu: str, it: InstanceType) -> bool:
        registered = cluster.gpu(gpu)
        if registered is None:
            return False
        gpus_free = registered.capacity - self.gpus_used.get((cluster.cluster_id, gpu.upper()), 0)
        instances_free = it.max_instances - self.instances_used.get((cluster.cluster_id, it.name.upper()), 0)
        return gpus_free >= it.gpu_count and instances_free >= 1


def placeable(cluster: Cluster, heartbeat: ClusterHeartbeat | None, ttl: float) -> bool:
    """May new instances go to this cluster now?"""
    return cluster.status is ClusterStatus.READY and is_healthy(heartbeat, ttl)
