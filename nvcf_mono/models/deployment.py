"""Deployments (``FunctionDeploymentDto``) and their GPU specifications (bucket ``nvcf_deployments``)."""

from __future__ import annotations

import enum
from typing import Any

from nvcf_mono.models.common import int_range, iso_duration_at_most, max_items, max_len
from nvcf_mono.models.function import FunctionStatus
from nvcf_mono.structure import WireModel, checked, wire

MAX_REQUEST_CONCURRENCY = 16384


@wire
class Stickiness(WireModel):
    """Hold a scaling decision for ``size`` unless it is contradicted for ``threshold``."""

    size: str = checked(check=iso_duration_at_most("PT1H"))
    threshold: str = checked(check=iso_duration_at_most("PT1H"))


@wire
class ScalingDetails(WireModel):
    """One direction of the autoscaling policy."""

    factor: float
    threshold: float = checked(check=int_range(0, 100))
    metric: str | None = checked(None, check=max_len(128))
    stickiness: Stickiness | None = None


@wire
class AutoscalingConfiguration(WireModel):
    """Per-spec autoscaling policy (reference autoscaler)."""

    scale_up_details: ScalingDetails | None = None
    scale_down_details: ScalingDetails | None = None


class AutoscalingPolicy(enum.Enum):
    """Whether a spec uses its own autoscaling configuration or the platform's."""

    CUSTOM_CONFIGURATION = "CUSTOM_CONFIGURATION"
    PLATFORM_CONFIGURATION = "PLATFORM_CONFIGURATION"


class HelmValidationPolicyName(enum.Enum):
    """Which ReVal rule set applies to a Helm chart."""

    DEFAULT = "DEFAULT"
    UNRESTRICTED = "UNRESTRICTED"


@wire
class HelmValidationPolicy(WireModel):
    """The Helm validation policy of a spec."""

    name: HelmValidationPolicyName = HelmValidationPolicyName.DEFAULT
    extra_kubernetes_types: tuple[Any, ...] | None = None


@wire
class PlacementStatus(WireModel):
    """Where a spec's instances stand; added by this platform to each spec of a response."""

    desired_instances: int
    placed_instances: int
    running_instances: int
    starting_instances: int
    waiting_instances: int
    waiting_reason: str | None = None
    failed_instances: int = 0
    last_failure: str | None = None
    autoscaler: str | None = None


@wire
class GpuSpec(WireModel):
    """One entry of ``deploymentSpecifications``."""

    gpu: str = checked(check=max_len(128))
    instance_type: str = checked(check=max_len(256))
    min_instances: int = checked(check=int_range(0, 100_000))
    max_instances: int = checked(check=int_range(1, 100_000))
    gpu_specification_id: str | None = None
    backend: str | None = checked(None, check=max_len(256))
    clusters: tuple[str, ...] | None = checked(None, check=max_items(100))
    regions: tuple[str, ...] | None = checked(None, check=max_items(100))
    attributes: tuple[str, ...] | None = checked(None, check=max_items(100))
    availability_zones: tuple[str, ...] | None = checked(None, check=max_items(100))
    preferred_order: int | None = checked(None, check=int_range(1, 99))
    max_request_concurrency: int | None = checked(None, check=int_range(1, MAX_REQUEST_CONCURRENCY))
    configuration: Any = None
    helm_validation_policy: HelmValidationPolicy | None = None
    autoscaling_configuration: AutoscalingConfiguration | None = None
    autoscaling_configuration_policy: AutoscalingPolicy | None = None
    cpu_arch: str | None = None
    os: str | None = None
    driver_version: str | None = None
    storage: str | None = None
    system_memory: str | None = None
    gpu_memory: str | None = None
    placement: PlacementStatus | None = None

    @property
    def concurrency(self) -> int:
        """``maxRequestConcurrency`` with its default of 1."""
        return self.max_request_concurrency or 1


@wire
class HealthInfo(WireModel):
    """Why a deployment failed: one entry per failed instance request."""

    icms_request_id: str
    gpu: str
    backend: str
    instance_type: str
    error: str


@wire
class Deployment(WireModel):
    """One deployment per function version."""

    function_id: str
    function_version_id: str
    deployment_id: str
    function_name: str
    nca_id: str
    function_status: FunctionStatus
    created_at: str
    last_updated_at: str
    deployment_specifications: tuple[GpuSpec, ...]
    health_info: tuple[HealthInfo, ...] | None = None
    #: Set while a graceful undeploy waits for the queue to drain.
    undeploying: bool | None = None


@wire
class DeploymentRequest(WireModel):
    """Body of ``POST``/``PUT`` on a deployment."""

    deployment_specifications: tuple[GpuSpec, ...] = checked(check=max_items(64))


@wire
class RollOverSpecification(WireModel):
    """How many instances of one of a deployment's GPU specifications to replace."""

    gpu: str = checked(check=max_len(128))
    instance_type: str = checked(check=max_len(256))
    num_instances: int = checked(check=int_range(1, 100_000))


@wire
class RollOverRequest(WireModel):
    """Body of ``PUT .../rolloverWorkers/functions/{fid}/versions/{vid}``."""

    roll_over_specifications: tuple[RollOverSpecification, ...] = checked(check=max_items(64))


@wire
class GpuSpecPatch(WireModel):
    """Body of ``PATCH /v2/nvcf/deployments/{did}/gpu-specifications/{specId}``."""

    min_instances: int | None = checked(None, check=int_range(0, 100_000))
    max_instances: int | None = checked(None, check=int_range(1, 100_000))
    autoscaling_configuration: AutoscalingConfiguration | None = None
    autoscaling_configuration_policy: AutoscalingPolicy | None = None
    # Fixed once deployed: present means a clear 400.
    gpu: Any = None
    instance_type: Any = None
    backend: Any = None
    clusters: Any = None
    max_request_concurrency: Any = None


@wire
class DeploymentResponse(WireModel):
    """``{deployment}``."""

    deployment: Deployment


@wire
class GpuSpecResponse(WireModel):
    """``{gpuSpecification}``."""

    gpu_specification: GpuSpec
