"""How stored records are shown: owner-only fields, instances, placement status, health info."""

from __future__ import annotations

from nvcf_mono.models.deployment import Deployment, GpuSpec, HealthInfo, PlacementStatus
from nvcf_mono.models.function import FunctionStatus, FunctionVersion, InstanceInfo
from nvcf_mono.models.placement import Phase, SpecPlacement
from nvcf_mono.planes.control.store import ControlStore
from nvcf_mono.structure import evolve

_INSTANCE_STATUS = {
    Phase.REQUESTED: "STARTING",
    Phase.ACKNOWLEDGED: "STARTING",
    Phase.STARTING: "STARTING",
    Phase.RUNNING: "ACTIVE",
}


def instances(store: ControlStore, fv: FunctionVersion) -> tuple[InstanceInfo, ...]:
    """The version's live instances (``activeInstances``)."""
    out = []
    for placement in store.placements_of(fv.version_id):
        for inst in placement.instances:
            status = _INSTANCE_STATUS.get(inst.phase)
            if status is None:
                continue
            out.append(
                InstanceInfo(
                    instance_id=inst.instance_id or inst.request_id,
                    function_id=fv.id,
                    function_version_id=fv.version_id,
                    instance_type=inst.instance_type,
                    instance_status=status,
                    icms_request_id=inst.request_id,
                    nca_id=fv.nca_id,
                    gpu=inst.gpu,
                    backend=inst.backend,
                    location=inst.region,
                    instance_created_at=inst.created_at,
                    instance_updated_at=inst.updated_at,
                )
            )
    return tuple(out)


def function_view(
    store: ControlStore, fv: FunctionVersion, *, owner: bool, details: bool, include_secrets: bool
) -> FunctionVersion:
    """A version as the caller may see it."""
    if not owner:
        # Accounts a function is shared with see what it is, not how it is built or run.
        return FunctionVersion(
            id=fv.id,
            nca_id=fv.nca_id,
            version_id=fv.version_id,
            name=fv.name,
            status=fv.status,
            created_at=fv.created_at,
            api_body_format=fv.api_body_format,
            function_type=fv.function_type,
            description=fv.description,
            tags=fv.tags,
            owned_by_different_account=True,
        )
    return evolve(
        fv,
        health_uri=fv.effective_health().uri,
        secrets=fv.secrets if (details and include_secrets) else None,
        active_instances=instances(store, fv) if details else None,
    )


def placement_status(placement: SpecPlacement | None, spec: GpuSpec, autoscaler: str | None) -> PlacementStatus:
    """Where a spec's instances stand, for the spec in a deployment response."""
    if placement is None:
        return PlacementStatus(
            desired_instances=spec.min_instances,
            placed_instances=0,
            running_instances=0,
            starting_instances=0,
            waiting_instances=0,
            autoscaler=autoscaler,
        )
    live = placement.live()
    last = placement.failures[-1] if placement.failures else None
    return PlacementStatus(
        desired_instances=placement.desired,
        placed_instances=len(live),
        running_instances=sum(1 for i in live if i.phase is Phase.RUNNING),
        starting_instances=sum(1 for i in live if i.phase is not Phase.RUNNING),
        waiting_instances=placement.waiting,
        waiting_reason=placement.waiting_reason,
        failed_instances=placement.total_failures,
        last_failure=None if last is None else f"{last.cause}: {last.error}"[:1024],
        autoscaler=autoscaler,
    )


def health_info(store: ControlStore, dep: Deployment) -> tuple[HealthInfo, ...]:
    """One entry per recent failed instance request of the deployment."""
    out = []
    for placement in store.placements_of(dep.function_version_id):
        for failure in placement.failures:
            out.append(
                HealthInfo(
                    icms_request_id=failure.request_id,
                    gpu=failure.gpu,
                    backend=failure.backend,
                    instance_type=failure.instance_type,
                    error=f"{failure.cause}: {failure.error}" if failure.error else failure.cause,
                )
            )
    return tuple(out)


def deployment_view(store: ControlStore, dep: Deployment) -> Deployment:
    """A deployment with the version's current status, placement per spec, and failures."""
    fv = store.functions.get(f"{dep.function_id}.{dep.function_version_id}")
    status = fv.status if fv is not None else dep.function_status
    specs = []
    for spec in dep.deployment_specifications:
        key = f"{dep.function_version_id}.{spec.gpu_specification_id}"
        target = store.autoscaler.get(key)
        reason = None if target is None else f"{target.desired} instance(s) since {target.at}: {target.reason}"
        specs.append(evolve(spec, placement=placement_status(store.placements.get(key), spec, reason)))
    failures = health_info(store, dep)
    show_health = status is FunctionStatus.ERROR or (
        failures and status in (FunctionStatus.DEPLOYING, FunctionStatus.DEGRADING, FunctionStatus.DEGRADED)
    )
    return evolve(
        dep,
        function_status=status,
        deployment_specifications=tuple(specs),
        health_info=failures if show_health else None,
    )
