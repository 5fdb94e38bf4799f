"""Creation and termination messages for the instances a ledger holds."""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from typing import Any

from nvcf_mono.auth.tokens import TokenSigner, mint_worker_token
from nvcf_mono.contracts import env
from nvcf_mono.contracts.messages import (
    Action,
    CreationMessage,
    FunctionDetails,
    LaunchSpecification,
    TerminationMessage,
)
from nvcf_mono.models.cluster import Cluster, parse_instance_type
from nvcf_mono.models.common import duration_seconds, now_iso
from nvcf_mono.models.deployment import Deployment, GpuSpec
from nvcf_mono.models.function import FunctionVersion, HealthProtocol
from nvcf_mono.models.placement import PlacedInstance
from nvcf_mono.planes.control.telemetry import function_environment, worker_exports


def instance_environment(
    fv: FunctionVersion,
    dep: Deployment,
    spec: GpuSpec,
    inst: PlacedInstance,
    *,
    worker_token: str,
    link: Mapping[str, str],
    secrets_present: bool,
    pull_credentials: str | None = None,
    chart_credentials: str | None = None,
    telemetry: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, str]:
    """The environment contract of a function instance (``contracts/env.py``); ``telemetry``: where the
    function's telemetry goes (``planes/control/telemetry.py``).
    """
    health = fv.effective_health()
    port = fv.inference_port or 8000
    values = {
        env.INFERENCE_URL: fv.inference_url or "/",
        env.INFERENCE_PORT: str(port),
        env.INFERENCE_PROTOCOL: "grpc" if fv.is_grpc else "http",
        env.INFERENCE_HEALTH_ENDPOINT: health.path,
        env.INFERENCE_HEALTH_PORT: str(health.port),
        env.INFERENCE_HEALTH_PROTOCOL: "grpc" if health.protocol is HealthProtocol.GRPC else "http",
        env.INFERENCE_HEALTH_EXPECTED_RESPONSE_CODE: str(health.expected),
        env.INFERENCE_HEALTH_TIMEOUT: f"{duration_seconds(health.timeout):g}",
        env.MAX_REQUEST_CONCURRENCY: str(spec.concurrency),
        env.NVCF_WORKER_TOKEN: worker_token,
        **link,
        env.NCA_ID: fv.nca_id,
        env.FUNCTION_ID: fv.id,
        env.FUNCTION_NAME: fv.name,
        env.FUNCTION_VERSION_ID: fv.version_id,
        env.FUNCTION_TYPE: fv.function_type.value,
        env.FUNCTION_SECRETS_PRESENT: "true" if secrets_present else "false",
        env.DEPLOYMENT_ID: dep.deployment_id,
        env.GPU_SPECIFICATION_ID: spec.gpu_specification_id or "",
        env.ICMS_REQUEST_ID: inst.request_id,
        env.GPU_NAME: inst.gpu,
        env.INSTANCE_TYPE: inst.instance_type,
        env.BACKEND: inst.backend,
        env.REGION: inst.region,
    }
    if fv.container_image is not None:
        values[env.INFERENCE_CONTAINER] = fv.container_image
        values[env.INFERENCE_CONTAINER_ARGS] = fv.container_args or ""
        # The OpenTelemetry SDK's variables first: one the function sets itself wins.
        values[env.INFERENCE_CONTAINER_ENV] = json.dumps(
            function_environment(fv, telemetry or {})
            + [{"key": kv.key, "value": kv.value} for kv in fv.container_environment or ()]
        )
    if fv.helm_chart_service_name is not None:
        values[env.HELM_CHART_INFERENCE_SERVICE_NAME] = fv.helm_chart_service_name
    if pull_credentials is not None:
        values[env.CONTAINER_REGISTRIES_CREDENTIALS] = pull_credentials
    if chart_credentials is not None:
        values[env.HELM_REGISTRIES_CREDENTIALS] = chart_credentials
    if telemetry:
        values[env.NVCF_TELEMETRY_EXPORTS] = worker_exports(telemetry)
    return values


def creation_message(
    fv: FunctionVersion,
    dep: Deployment,
    spec: GpuSpec,
    inst: PlacedInstance,
    cluster: Cluster,
    *,
    signer: TokenSigner,
    link: Mapping[str, str],
    secrets_present: bool,
    pull_credentials: str | None = None,
    chart_credentials: str | None = None,
    telemetry: Mapping[str, Mapping[str, Any]] | None = None,
) -> CreationMessage:
    """``Create.NVCA.Function...`` for one instance."""
    token = mint_worker_token(
        signer, nca_id=fv.nca_id, function_id=fv.id, function_version_id=fv.version_id, request_id=inst.request_id
    )
    parsed = parse_instance_type(inst.instance_type)
    return CreationMessage(
        request_id=inst.request_id,
        nca_id=fv.nca_id,
        action=Action.REQUEST_INSTANCES,
        cluster_id=cluster.cluster_id,
        instance_count=1,
        instance_type_name=inst.instance_type,
        instance_type_value=parsed.value if parsed is not None else inst.instance_type,
        gpu_type=inst.gpu,
        requested_gpu_count=inst.gpu_count,
        message_batch_id=inst.request_id,
        created_at=now_iso(),
        deployment_id=dep.deployment_id,
        gpu_specification_id=spec.gpu_specification_id,
        function_details=FunctionDetails(
            function_id=fv.id,
            function_version_id=fv.version_id,
            function_type=fv.function_type.value,
            function_name=fv.name,
        ),
        launch_specification=LaunchSpecification(
            gpu_name=inst.gpu,
            cloud_provider=cluster.cloud_provider,
            container_image=fv.container_image,
            helm_chart=fv.helm_chart,
            configuration=spec.configuration,
            environment=instance_environment(
                fv,
                dep,
                spec,
                inst,
                worker_token=token,
                link=link,
                secrets_present=secrets_present,
                pull_credentials=pull_credentials,
                chart_credentials=chart_credentials,
                telemetry=telemetry,
            ),
        ),
    )


def termination_message(
    nca_id: str, function_id: str, function_version_id: str, inst: PlacedInstance, cluster_name: str
) -> TerminationMessage:
    """``Terminate.NVCA.<cluster>`` for one instance (by id when known, and by its request)."""
    return TerminationMessage(
        request_id=f"{inst.request_id}-terminate",
        nca_id=nca_id,
        action=Action.TERMINATE_INSTANCES,
        cluster_id=inst.cluster_id,
        created_at=now_iso(),
        instance_ids=(inst.instance_id,) if inst.instance_id else (),
        request_ids=(inst.request_id,),
        availability_zone=cluster_name,
        function_id=function_id,
        function_version_id=function_version_id,
        reason=inst.termination_reason,
    )


def split_args(args: str | None) -> list[str]:
    """ContainerArgs as the agent splits it."""
    return shlex.split(args or "")
