"""Payloads that cross plane boundaries on the bus (JSON, camelCase, unknown fields tolerated).

Creation and termination messages keep NVCF's field names (reference compute-plane §1); the
``nvcf.icms.*`` calls carry what NVCA sends ICMS over REST in NVCF.
"""

from __future__ import annotations

import enum
from typing import Any, TypeVar

import attrs

from nvcf_mono import compact_json
from nvcf_mono.models.cluster import ClusterGpu, GpuUsage, MaintenanceMode
from nvcf_mono.structure import StructureError, WireModel, structure_json, unstructure, wire

M = TypeVar("M")


class MessageError(ValueError):
    """A payload that is not JSON or does not match its model."""


def encode(message: Any) -> bytes:
    """Compact JSON of a payload (null fields omitted)."""
    return compact_json.dumps(unstructure(message, omit_none=True))


def decode(tp: type[M], data: bytes) -> M:
    """The payload in ``data``; raises :class:`MessageError`."""
    try:
        raw = compact_json.loads(data) if data else {}
    except ValueError as err:
        raise MessageError(f"{tp.__name__}: not JSON") from err
    try:
        return structure_json(tp, raw)
    except StructureError as err:
        raise MessageError(f"{tp.__name__}: {err}") from err


# ---- control plane -> agent -----------------------------------------------------------------------


class Action(enum.Enum):
    """``action`` of creation, termination and status messages."""

    REQUEST_INSTANCES = "RequestICMSInstances"
    REQUEST_INSTANCES_FOR_TASK = "RequestICMSInstancesForTask"
    TERMINATE_INSTANCES = "TerminateInstances"


@wire
class FunctionDetails(WireModel):
    """What function version an instance serves."""

    function_id: str
    function_version_id: str
    function_type: str = "DEFAULT"
    function_name: str | None = None


@wire
class TaskDetails(WireModel):
    """What task an instance runs."""

    task_id: str
    task_type: str = "CONTAINER"
    task_name: str | None = None


@wire
class LaunchSpecification(WireModel):
    """How to launch: the instance env contract (``contracts/env.py``) and workload specifics."""

    gpu_name: str
    environment: dict[str, str] = attrs.field(factory=dict)
    cloud_provider: str | None = None
    container_image: str | None = None
    helm_chart: str | None = None
    configuration: Any = None
    max_runtime_duration: str | None = None
    max_queued_duration: str | None = None
    termination_grace_period_duration: str | None = None
    result_handling_strategy: str | None = None


@wire
class CreationMessage(WireModel):
    """``Create.NVCA.{Function|Task}.<cluster>.<gpu>.<type>``: launch ``instanceCount`` instances."""

    request_id: str
    nca_id: str
    action: Action
    cluster_id: str
    instance_count: int
    instance_type_name: str
    instance_type_value: str
    gpu_type: str
    requested_gpu_count: int
    message_batch_id: str
    created_at: str
    launch_specification: LaunchSpecification
    deployment_id: str | None = None
    gpu_specification_id: str | None = None
    function_details: FunctionDetails | None = None
    task_details: TaskDetails | None = None

    @property
    def gpus_needed(self) -> int:
        return self.instance_count * max(self.requested_gpu_count, 1)


@wire
class TerminationMessage(WireModel):
    """``Terminate.NVCA.<cluster>``: stop instances (by id, or every instance of a request)."""

    request_id: str
    nca_id: str
    action: Action
    cluster_id: str
    created_at: str
    instance_ids: tuple[str, ...] = ()
    #: Instance requests to stop whole (also those whose instances have not reported an id yet).
    request_ids: tuple[str, ...] = ()
    availability_zone: str | None = None
    function_id: str | None = None
    function_version_id: str | None = None
    task_id: str | None = None
    reason: str | None = None


# ---- agent -> control plane (nvcf.icms.*) ---------------------------------------------------------


@wire
class ClusterRegistration(WireModel):
    """``register``: the agent's cluster, GPUs and instance types (sent at start and on change)."""

    cluster_id: str
    cluster_name: str
    region: str
    gpus: tuple[ClusterGpu, ...]
    cluster_group_name: str | None = None
    nca_id: str | None = None
    cloud_provider: str = "ON-PREM"
    attributes: tuple[str, ...] = ()
    capabilities: tuple[str, ...] = ()
    authorized_nca_ids: tuple[str, ...] = ()
    nvca_version: str = "0.0.0"
    k8s_version: str | None = None
    status: str = "READY"


@wire
class RegistrationResponse(WireModel):
    """What the control plane assigned."""

    cluster_id: str
    cluster_group_id: str
    cluster_group_name: str
    #: Where instances dial the WorkerService now (the platform may have come back on other ports).
    worker_grpc_address: str | None = None


@wire
class Heartbeat(WireModel):
    """``heartbeat``: health and GPU usage, every few seconds."""

    status: str
    gpu_usage: dict[str, GpuUsage] = attrs.field(factory=dict)
    maintenance_mode: MaintenanceMode = MaintenanceMode.NONE
    nvca_version: str | None = None


class HeartbeatAction(enum.Enum):
    """The control plane's answer to a heartbeat."""

    ACCEPTED = "ACCEPTED"
    SELF_DESTRUCT = "SELF_DESTRUCT"
    REGISTER = "REGISTER"  # the control plane does not know the cluster: register again


@wire
class HeartbeatResponse(WireModel):
    """``{action}``."""

    action: HeartbeatAction
    #: Where instances dial the WorkerService now.
    worker_grpc_address: str | None = None


@wire
class AckRequest(WireModel):
    """``ack``: the agent holds the creation request (NVCA's ``PUT /v1/sirs/{requestId}``)."""

    request_id: str
    instance_count: int
    message_batch_id: str
    status: str = "pending-fulfillment"
    function_version_id: str | None = None
    gpu_specification_id: str | None = None
    task_id: str | None = None


@wire
class Empty(WireModel):
    """A reply with nothing to say."""


@wire
class InstanceHealthInfo(WireModel):
    """Why an instance failed: the source and the last ~1 KB of logs/events."""

    error_log: str
    error_source: str = "k8s"


class RequestState(enum.Enum):
    """Whether the instance request is still open."""

    ACTIVE = "active"
    CLOSED = "closed"


@wire
class InstanceStatusReport(WireModel):
    """``status``: one instance's state (NVCA's ``POST /v1/sirs/{requestId}/{instanceId}``)."""

    request_id: str
    instance_id: str
    status: str
    instance_state: str
    request_state: RequestState
    action: str
    at: str
    termination_cause: str | None = None
    health_info: InstanceHealthInfo | None = None
    system_failure: str | None = None
    function_id: str | None = None
    function_version_id: str | None = None
    gpu_specification_id: str | None = None
    task_id: str | None = None
    message_batch_id: str | None = None


@wire
class InstanceListRequest(WireModel):
    """``instances``: what the control plane believes runs on the cluster."""


@wire
class ListedInstance(WireModel):
    """One instance the control plane knows on a cluster."""

    instance_id: str | None
    request_id: str
    instance_state: str


@wire
class InstanceListing(WireModel):
    """``{instances}``."""

    instances: tuple[ListedInstance, ...]


# ---- instance -> control plane --------------------------------------------------------------------


@wire
class SecretsFetch(WireModel):
    """Ask for the secrets of the instance's function version or task, with its worker token."""

    worker_token: str


@wire
class SecretsReply(WireModel):
    """Name -> value (a string, or a JSON object as given); and ``NVCF_TELEMETRY_EXPORTS`` as it is now
    (a telemetry's secret may have been replaced since the instance started; None: no endpoint, or a
    control plane that does not say).
    """

    secrets: dict[str, Any]
    telemetry_exports: str | None = None


# ---- task workers -> control plane (relayed by the invocation node that holds their gRPC call) ------


@wire
class TaskConnectCall(WireModel):
    """A task's worker is up."""

    task_id: str
    request_id: str
    instance_id: str = ""


@wire
class TaskConnectReply(WireModel):
    status: str
    heartbeat_interval: float
    result_handling: str


@wire
class TaskHeartbeatCall(WireModel):
    """Alive, with the progress file's content when there is one."""

    task_id: str
    has_progress: bool = False
    percent_complete: int = 0
    name: str | None = None
    metadata: Any = None
    last_updated_at: str | None = None


@wire
class TaskStatusReply(WireModel):
    status: str


@wire
class TaskResultCall(WireModel):
    """A result file, stored (``object_name``) or, with result handling NONE, only named."""

    task_id: str
    name: str
    size: int
    metadata: Any = None
    object_name: str | None = None


@wire
class TaskResultReply(WireModel):
    result_id: str


@wire
class TaskRoomCall(WireModel):
    """Asked before a result's content is uploaded: how large it may be."""

    task_id: str


@wire
class TaskRoomReply(WireModel):
    """The most a result's content may hold, and what sets that limit (for the error past it)."""

    max_bytes: int
    why: str
    #: The limit is the store's room now, which frees as queued requests drain: worth trying again later.
    passing: bool = False
    #: Whose task it is, and what its quota leaves (None: no quota): results stored at once on a node
    #: share it (the node counts what the account's other uploads bring until they are recorded).
    account: str = ""
    account_left: int | None = None
