"""The agent's calls to the control plane (NVCA -> ICMS in NVCF), on ``nvcf.icms.<call>.<clusterId>``."""

from __future__ import annotations

from nvcf_mono.bus.api import Bus
from nvcf_mono.contracts import rpc, states, subjects
from nvcf_mono.contracts.agent import AgentInstance, AgentRequest
from nvcf_mono.contracts.messages import (
    AckRequest,
    Action,
    ClusterRegistration,
    Empty,
    Heartbeat,
    HeartbeatResponse,
    InstanceHealthInfo,
    InstanceListing,
    InstanceListRequest,
    InstanceStatusReport,
    RegistrationResponse,
    RequestState,
)
from nvcf_mono.models.common import now_iso

#: Status reports carry NVCA's legacy action names (``toLegacyAction``).
_LEGACY_ACTION = {
    Action.REQUEST_INSTANCES: "RequestSpotInstances",
    Action.REQUEST_INSTANCES_FOR_TASK: "RequestSpotInstancesForTask",
    Action.TERMINATE_INSTANCES: "TerminateInstances",
}


class ControlClient:
    """Typed request/reply with the control plane for one cluster."""

    def __init__(self, bus: Bus, cluster_id: str, *, timeout: float) -> None:
        self._bus = bus
        self._id = cluster_id
        self._timeout = timeout

    async def register(self, registration: ClusterRegistration) -> RegistrationResponse:
        return await rpc.call(
            self._bus, subjects.icms_subject("register", self._id), registration, RegistrationResponse,
            timeout=self._timeout,
        )  # fmt: skip

    async def heartbeat(self, beat: Heartbeat) -> HeartbeatResponse:
        return await rpc.call(
            self._bus, subjects.icms_subject("heartbeat", self._id), beat, HeartbeatResponse, timeout=self._timeout
        )

    async def ack(self, req: AgentRequest) -> None:
        """The agent holds the request (raises RpcError 404 when it is not wanted any more)."""
        msg = req.message
        body = AckRequest(
            request_id=msg.request_id,
            instance_count=msg.instance_count,
            message_batch_id=msg.message_batch_id,
            function_version_id=msg.function_details.function_version_id if msg.function_details else None,
            gpu_specification_id=msg.gpu_specification_id,
            task_id=msg.task_details.task_id if msg.task_details else None,
        )
        await rpc.call(self._bus, subjects.icms_subject("ack", self._id), body, Empty, timeout=self._timeout)

    async def status(self, report: InstanceStatusReport) -> None:
        """Report one instance (raises RpcError 412 when the control plane wants it terminated)."""
        await rpc.call(self._bus, subjects.icms_subject("status", self._id), report, Empty, timeout=self._timeout)

    async def instances(self) -> InstanceListing:
        return await rpc.call(
            self._bus,
            subjects.icms_subject("instances", self._id),
            InstanceListRequest(),
            InstanceListing,
            timeout=self._timeout,
        )


def status_report(req: AgentRequest, inst: AgentInstance) -> InstanceStatusReport:
    """NVCA's ``POST /v1/sirs/{requestId}/{instanceId}`` body for one instance as it stands."""
    msg = req.message
    gone = inst.gone
    action = Action.TERMINATE_INSTANCES if gone and inst.stop is not None else msg.action
    bad = inst.state in states.BAD_STATES
    return InstanceStatusReport(
        request_id=req.request_id,
        instance_id=inst.instance_id,
        status=inst.status,
        instance_state=inst.state,
        request_state=RequestState.CLOSED if gone else RequestState.ACTIVE,
        action=_LEGACY_ACTION.get(action, action.value),
        at=now_iso(),
        termination_cause=inst.termination_cause,
        health_info=InstanceHealthInfo(error_log=inst.error_log, error_source=inst.error_source or "k8s")
        if inst.error_log and (bad or gone)
        else None,
        system_failure=inst.termination_cause if bad else None,
        function_id=msg.function_details.function_id if msg.function_details else None,
        function_version_id=msg.function_details.function_version_id if msg.function_details else None,
        gpu_specification_id=msg.gpu_specification_id,
        task_id=msg.task_details.task_id if msg.task_details else None,
        message_batch_id=msg.message_batch_id,
    )


def unknown_terminated(request_id: str, instance_id: str, function_version_id: str | None) -> InstanceStatusReport:
    """A termination for a request this agent does not hold: it is gone, say so."""
    return InstanceStatusReport(
        request_id=request_id,
        instance_id=instance_id,
        status=states.TERMINATED_BY_USER,
        instance_state=states.TERMINATED,
        request_state=RequestState.CLOSED,
        action=_LEGACY_ACTION[Action.TERMINATE_INSTANCES],
        at=now_iso(),
        function_version_id=function_version_id,
    )
