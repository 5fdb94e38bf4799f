"""``/v2/nvcf/deployments``: deploy a version on GPU specs, rescale a spec, undeploy."""

from __future__ import annotations

from typing import Any

from nvcf_mono.auth import scopes as S
from nvcf_mono.bus.errors import ConflictError
from nvcf_mono.bus.mirror import Unchanged
from nvcf_mono.contracts import buckets
from nvcf_mono.http.api import Call, Param, Routes
from nvcf_mono.http.problem import ProblemError
from nvcf_mono.models.common import new_id, now_iso, utc_now
from nvcf_mono.models.deployment import (
    AutoscalingPolicy,
    Deployment,
    DeploymentRequest,
    DeploymentResponse,
    GpuSpec,
    GpuSpecPatch,
    GpuSpecResponse,
    RollOverRequest,
)
from nvcf_mono.models.function import FunctionResponse, FunctionStatus, FunctionVersion
from nvcf_mono.models.placement import SpecPlacement
from nvcf_mono.planes.control.catalog import check_autoscaling, check_spec
from nvcf_mono.planes.control.charts import check_chart
from nvcf_mono.planes.control.context import Control
from nvcf_mono.planes.control.reconcile.plan import mark_rollover
from nvcf_mono.planes.control.service import (
    forget_deployment,
    new_deployment,
    owned_version,
    set_status,
    undeploy,
)
from nvcf_mono.planes.control.validation import workload_problem
from nvcf_mono.planes.control.views import deployment_view, function_view
from nvcf_mono.structure import evolve

TAG = "deployments"
routes: Routes[Control] = Routes()
D = "/v2/nvcf/deployments/functions/{functionId}/versions/{versionId}"
UPDATABLE = frozenset(
    {FunctionStatus.ACTIVE, FunctionStatus.DEPLOYING, FunctionStatus.DEGRADED, FunctionStatus.DEGRADING}
)


def check_stored_workload(fv: FunctionVersion) -> None:
    """A version stored before the platform's environment rule (or around it) is refused when deployed."""
    problem = workload_problem(fv.container_environment, fv.container_args)
    if problem is not None:
        raise ProblemError(
            400,
            f"Function '{fv.id}' version '{fv.version_id}' cannot be deployed: {problem}; "
            "create a new version without it",
        )


async def owned_deployment(ctl: Control, call: Call[Any]) -> tuple[Deployment, FunctionVersion]:
    fv = await owned_version(ctl, call)
    dep = await ctl.store.deployments.fetch(buckets.version_key(fv.id, fv.version_id))
    if dep is None:
        raise ProblemError(404, f"Function '{fv.id}' version '{fv.version_id}' is not deployed")
    return dep, fv


@routes.route(
    "POST",
    D,
    summary="Deploy a version: DEPLOYING, or ACTIVE at once when every minInstances is 0.",
    tag=TAG,
    scopes=(S.DEPLOY_FUNCTION,),
    body=DeploymentRequest,
    response=DeploymentResponse,
    errors=(404,),
    cross_account=True,
)
async def create_deployment(ctl: Control, call: Call[DeploymentRequest]) -> DeploymentResponse:
    fv = await owned_version(ctl, call)
    specs_in = call.body.deployment_specifications
    if not specs_in:
        raise ProblemError(400, "'deploymentSpecifications' must not be empty")
    store = ctl.store
    key = buckets.version_key(fv.id, fv.version_id)
    existing = await store.deployments.fetch(key)
    if existing is not None:
        if existing.undeploying:
            raise ProblemError(400, "A graceful undeploy of this version is still draining its queue; retry later")
        raise ProblemError(400, "Function version is already deployed; use PATCH endpoint to update gpu-specification")
    if fv.status is FunctionStatus.ERROR:
        raise ProblemError(400, "Function version is in ERROR; remove its deployment first")
    check_stored_workload(fv)
    clusters = store.clusters.values()
    specs = tuple(evolve(check_spec(clusters, fv.nca_id, spec, fv), gpu_specification_id=new_id()) for spec in specs_in)
    await check_values(ctl, fv, specs)
    dep = new_deployment(fv, specs)
    try:
        await store.deployments.create(key, dep)
    except ConflictError:
        raise ProblemError(
            400, "Function version is already deployed; use PATCH endpoint to update gpu-specification"
        ) from None
    if await store.functions.fetch(key) is None:
        # The version was deleted meanwhile, by a call that found no deployment to remove: take it back.
        await forget_deployment(ctl, dep)
        raise ProblemError(404, f"Function '{fv.id}' version '{fv.version_id}' was deleted while it was being deployed")
    status = FunctionStatus.ACTIVE if all(s.min_instances == 0 for s in specs) else FunctionStatus.DEPLOYING
    await set_status(ctl, fv, status)
    ctl.poke()
    return DeploymentResponse(deployment=deployment_view(store, dep))


@routes.route(
    "GET",
    D,
    summary="Read a version's deployment, with where each spec's instances stand.",
    tag=TAG,
    scopes=(S.DEPLOY_FUNCTION,),
    response=DeploymentResponse,
    errors=(404,),
    cross_account=True,
)
async def get_deployment(ctl: Control, call: Call[None]) -> DeploymentResponse:
    dep, _ = await owned_deployment(ctl, call)
    return DeploymentResponse(deployment=deployment_view(ctl.store, dep))


async def by_id(ctl: Control, call: Call[Any], deployment_id: str) -> Deployment:
    dep = await ctl.store.deployment_now(deployment_id)  # one another control node made a moment ago too
    if dep is None or dep.nca_id != call.account:
        raise ProblemError(404, f"Deployment '{deployment_id}' not found")
    return dep


@routes.route(
    "GET",
    "/v2/nvcf/deployments/{deploymentId}",
    summary="Read a deployment by its id.",
    tag=TAG,
    scopes=(S.DEPLOY_FUNCTION,),
    response=DeploymentResponse,
    errors=(404,),
    cross_account=True,
)
async def get_deployment_by_id(ctl: Control, call: Call[None]) -> DeploymentResponse:
    dep = await by_id(ctl, call, call.path("deploymentId"))
    return DeploymentResponse(deployment=deployment_view(ctl.store, dep))


@routes.route(
    "PUT",
    D,
    summary="Rescale every spec (deprecated: PATCH a gpu specification instead).",
    tag=TAG,
    scopes=(S.DEPLOY_FUNCTION,),
    body=DeploymentRequest,
    response=DeploymentResponse,
    errors=(404,),
    cross_account=True,
    deprecated=True,
)
async def update_deployment(ctl: Control, call: Call[DeploymentRequest]) -> DeploymentResponse:
    dep, fv = await owned_deployment(ctl, call)
    status = ctl.store.functions.get(buckets.version_key(dep.function_id, dep.function_version_id))
    if status is None or status.status not in UPDATABLE or dep.undeploying:
        raise ProblemError(400, "the deployment can only be updated while ACTIVE, DEPLOYING, DEGRADED or DEGRADING")
    wanted = call.body.deployment_specifications
    if len(wanted) != len(dep.deployment_specifications):
        raise ProblemError(400, "the number of deployment specifications cannot change")
    by_id_ = {s.gpu_specification_id: s for s in dep.deployment_specifications}
    clusters = ctl.store.clusters.values()
    updated: list[GpuSpec] = []
    for index, asked in enumerate(wanted):
        # Checked as a deploy checks it: an unknown GPU or instance type is a 400, never ignored.
        new = check_spec(clusters, fv.nca_id, asked, fv)
        old = by_id_.get(new.gpu_specification_id) if new.gpu_specification_id else dep.deployment_specifications[index]
        if old is None:
            raise ProblemError(400, f"unknown gpuSpecificationId {new.gpu_specification_id!r}")
        if (asked.backend or None) != (old.backend or None) or tuple(asked.clusters or ()) != tuple(old.clusters or ()):
            raise ProblemError(400, "'backend' and 'clusters' must match the existing deployment")
        if (new.gpu, new.instance_type) != (old.gpu, old.instance_type):
            raise ProblemError(
                400,
                f"'gpu' and 'instanceType' cannot change ({old.gpu} {old.instance_type} is deployed, got "
                f"{new.gpu} {new.instance_type}); undeploy and deploy again",
            )
        updated.append(
            evolve(
                old,
                min_instances=new.min_instances,
                max_instances=new.max_instances,
                max_request_concurrency=new.max_request_concurrency or old.max_request_concurrency,
            )
        )
    result = await _write_specs(ctl, dep, {s.gpu_specification_id or "": s for s in updated})
    return DeploymentResponse(deployment=deployment_view(ctl.store, result))


@routes.route(
    "PATCH",
    "/v2/nvcf/deployments/{deploymentId}/gpu-specifications/{specId}",
    summary="Rescale one gpu specification (min/max instances, autoscaling); takes effect at once.",
    tag=TAG,
    scopes=(S.DEPLOY_FUNCTION,),
    body=GpuSpecPatch,
    response=GpuSpecResponse,
    errors=(404,),
    cross_account=True,
)
async def patch_gpu_specification(ctl: Control, call: Call[GpuSpecPatch]) -> GpuSpecResponse:
    patch = call.body
    for name, value in (
        ("gpu", patch.gpu),
        ("instanceType", patch.instance_type),
        ("backend", patch.backend),
        ("clusters", patch.clusters),
        ("maxRequestConcurrency", patch.max_request_concurrency),
    ):
        if value is not None:
            raise ProblemError(400, f"'{name}' cannot be changed on a deployed gpu specification; redeploy instead")
    if (
        patch.min_instances is None
        and patch.max_instances is None
        and patch.autoscaling_configuration is None
        and patch.autoscaling_configuration_policy is None
    ):
        raise ProblemError(
            400,
            "At least one of 'minInstances', 'maxInstances', 'autoscalingConfiguration' or "
            "'autoscalingConfigurationPolicy' must be specified",
        )
    dep = await by_id(ctl, call, call.path("deploymentId"))
    spec_id = call.path("specId")
    spec = next((s for s in dep.deployment_specifications if s.gpu_specification_id == spec_id), None)
    if spec is None:
        raise ProblemError(404, f"gpu specification '{spec_id}' not found in deployment '{dep.deployment_id}'")
    lo = patch.min_instances if patch.min_instances is not None else spec.min_instances
    hi = patch.max_instances if patch.max_instances is not None else spec.max_instances
    if lo > hi:
        raise ProblemError(400, "'minInstances' must be lesser than or equal to 'maxInstances'")
    check_autoscaling(patch.autoscaling_configuration)
    policy = patch.autoscaling_configuration_policy or spec.autoscaling_configuration_policy
    autoscaling = patch.autoscaling_configuration or spec.autoscaling_configuration
    if patch.autoscaling_configuration_policy is AutoscalingPolicy.PLATFORM_CONFIGURATION:
        autoscaling = None
    new_spec = evolve(
        spec,
        min_instances=lo,
        max_instances=hi,
        autoscaling_configuration=autoscaling,
        autoscaling_configuration_policy=policy,
    )
    result = await _write_specs(ctl, dep, {spec_id: new_spec})
    shown = deployment_view(ctl.store, result)
    return GpuSpecResponse(
        gpu_specification=next(s for s in shown.deployment_specifications if s.gpu_specification_id == spec_id)
    )


@routes.route(
    "DELETE",
    D,
    summary="Undeploy: the version goes INACTIVE; graceful=true lets the queue drain first.",
    tag=TAG,
    scopes=(S.DEPLOY_FUNCTION,),
    response=FunctionResponse,
    params=(
        Param(
            name="graceful",
            description="Wait for queued requests before terminating instances.",
            schema={"type": "boolean"},
        ),
    ),
    errors=(404,),
    cross_account=True,
)
async def delete_deployment(ctl: Control, call: Call[None]) -> FunctionResponse:
    dep, fv = await owned_deployment(ctl, call)
    if dep.undeploying and call.query_bool("graceful"):
        raise ProblemError(400, "A graceful undeploy of this version is already draining its queue")
    updated = await undeploy(ctl, fv, graceful=call.query_bool("graceful"))
    return FunctionResponse(function=function_view(ctl.store, updated, owner=True, details=True, include_secrets=False))


async def check_values(ctl: Control, fv: FunctionVersion, specs: tuple[GpuSpec, ...]) -> None:
    """A Helm function's chart, validated again with each spec's ``configuration`` values."""
    if fv.helm_chart is None or not ctl.config.helm.enabled:
        return
    for spec in specs:
        if spec.configuration is not None and not isinstance(spec.configuration, dict):
            raise ProblemError(400, "'configuration' must be a JSON object of Helm values")
        await check_chart(
            ctl.validator,
            chart=fv.helm_chart,
            service_name=fv.helm_chart_service_name,
            service_port=fv.inference_port,
            configuration=spec.configuration,
            account=(ctl.store, ctl.keyring, fv.nca_id),
            what=f"helmChart {fv.helm_chart!r} with the configuration of {spec.gpu} {spec.instance_type}",
        )


async def _write_specs(ctl: Control, dep: Deployment, changed: dict[str, GpuSpec]) -> Deployment:
    """Replace some specs of a deployment (CAS) and wake the reconciler."""
    key = buckets.version_key(dep.function_id, dep.function_version_id)

    def change(current: Deployment | None) -> Deployment | None:
        if current is None or current.deployment_id != dep.deployment_id:
            raise ProblemError(404, f"Deployment '{dep.deployment_id}' not found")
        specs = tuple(changed.get(s.gpu_specification_id or "", s) for s in current.deployment_specifications)
        return evolve(current, deployment_specifications=specs, last_updated_at=now_iso())

    result = await ctl.store.deployments.mutate(key, change)
    assert result is not None
    ctl.poke()
    return result


@routes.route(
    "PUT",
    "/v2/nvcf/accounts/{ncaId}/rolloverWorkers/functions/{functionId}/versions/{versionId}",
    summary="Replace running instances of a deployment with new ones, one at a time (super admin).",
    description="For each rollOverSpecification, up to numInstances of the spec's live instances, oldest first, "
    "are replaced: a new instance starts (on the most preferred cluster with room) and the old one is "
    "terminated once the new one runs; where no cluster has room for one more, the old one goes first. "
    "Instances already being replaced are not counted again.",
    tag=TAG,
    scopes=(f"admin:{S.DEPLOY_FUNCTION}",),
    body=RollOverRequest,
    response=DeploymentResponse,
    errors=(400, 404),
    account_from_path=True,
)
async def roll_over_workers(ctl: Control, call: Call[RollOverRequest]) -> DeploymentResponse:
    dep, _ = await owned_deployment(ctl, call)
    asked = call.body.roll_over_specifications
    if not asked:
        raise ProblemError(400, "rollOverSpecifications must name at least one gpu and instanceType")
    counts: dict[str, int] = {}
    for ask in asked:
        spec = next(
            (s for s in dep.deployment_specifications if (s.gpu, s.instance_type) == (ask.gpu, ask.instance_type)),
            None,
        )
        if spec is None or spec.gpu_specification_id is None:
            deployed_specs = ", ".join(f"{s.gpu} {s.instance_type}" for s in dep.deployment_specifications)
            raise ProblemError(
                400, f"the deployment has no specification {ask.gpu} {ask.instance_type} (it has {deployed_specs})"
            )
        counts[spec.gpu_specification_id] = counts.get(spec.gpu_specification_id, 0) + ask.num_instances
    now = utc_now()
    for key, ledger in ctl.store.placements.items():
        count = counts.get(ledger.gpu_specification_id)
        if ledger.function_version_id != dep.function_version_id or not count:
            continue

        def mark(current: SpecPlacement | None, count: int = count) -> SpecPlacement:
            if current is None:
                raise Unchanged
            updated, marked = mark_rollover(current, count, now)
            if not marked:
                raise Unchanged
            return updated

        await ctl.store.placements.mutate(key, mark)
    ctl.poke()
    return DeploymentResponse(deployment=deployment_view(ctl.store, dep))
