"""What a cluster agent keeps about its instance requests (bucket ``nvcf_agent_requests``), and what
it answers about them on ``nvcf.agent.<call>.<clusterId>`` (for the CLI and tests).

A record is NVCA's ``ICMSRequest`` (reference compute-plane §2): the creation message, the request
status of NVCA's state machine, and one entry per instance with the processes that run it, so an
agent that restarts re-adopts what still runs instead of starting it twice.
"""

from __future__ import annotations

import enum

from nvcf_mono.contracts import states
from nvcf_mono.contracts.messages import CreationMessage
from nvcf_mono.structure import WireModel, wire


class RequestStatus(enum.Enum):
    """NVCA's request status (``requestStatus`` of an ICMSRequest)."""

    #: Recorded; the control plane has not confirmed it yet (NVCA's unnamed initial state).
    RECEIVED = "RequestReceived"
    PENDING = "RequestPending"
    IN_PROGRESS = "RequestInProgress"
    INSTANCES_IN_PROGRESS = "RequestInstancesInProgress"
    COMPLETED = "RequestCompleted"
    FAILED = "RequestFailed"
    COMPLETION_ACKNOWLEDGED = "RequestCompletionAcknowledged"
    FAILURE_ACKNOWLEDGED = "RequestFailureAcknowledged"


@wire
class AgentProcess(WireModel):
    """One process of an instance; pid and start time together say it is still the same process."""

    role: str  # "inference" or "worker"
    pid: int
    #: Start time in clock ticks after boot (``/proc/<pid>/stat`` field 22); 0 where unknown.
    start_ticks: int
    started_at: str


@wire
class AgentInstance(WireModel):
    """One instance of a request: where it runs and what was last reported about it."""

    instance_id: str
    created_at: str
    updated_at: str
    state: str = states.STARTING
    status: str = states.PENDING_FULFILLMENT
    port: int | None = None
    health_port: int | None = None
    node: int = 0
    devices: tuple[int, ...] = ()
    directory: str | None = None
    processes: tuple[AgentProcess, ...] = ()
    #: Times the instance's processes exited and were (to be) started again, recent ones only.
    restart_times: tuple[str, ...] = ()
    restarts: int = 0
    launched_at: str | None = None
    ready_at: str | None = None
    not_ready_since: str | None = None
    termination_cause: str | None = None
    error_log: str | None = None
    error_source: str | None = None
    #: Why the agent stops it (``by-user``, a termination cause); None while it should run.
    stop: str | None = None
    #: ``<status>|<instanceState>`` the control plane last accepted.
    reported: str | None = None
    reported_at: str | None = None

    @property
    def gone(self) -> bool:
        """The instance no longer runs (terminated, succeeded or failed)."""
        return self.state in states.GONE_STATES

    @property
    def signature(self) -> str:
        return f"{self.status}|{self.state}"

    @property
    def settled(self) -> bool:
        """Gone, and the control plane knows."""
        return self.gone and self.reported == self.signature


@wire
class AgentRequest(WireModel):
    """An instance request held by a cluster agent (key ``<clusterId>.<requestId>``)."""

    request_id: str
    cluster_id: str
    status: RequestStatus
    created_at: str
    updated_at: str
    message: CreationMessage
    instances: tuple[AgentInstance, ...] = ()
    acked_at: str | None = None
    #: Why the request failed as a whole (refused by the control plane, unsupported workload).
    error: str | None = None
    finished_at: str | None = None

    def instance(self, instance_id: str) -> AgentInstance | None:
        for inst in self.instances:
            if inst.instance_id == instance_id:
                return inst
        return None

    @property
    def finished(self) -> bool:
        """Every instance is gone and reported: only a tombstone (for redeliveries) is left."""
        return all(i.settled for i in self.instances)


# ---- queries (nvcf.agent.<call>.<clusterId>) ------------------------------------------------------


@wire
class AgentQuery(WireModel):
    """Ask an agent about its cluster, its instances, or one instance's logs."""

    instance_id: str | None = None
    #: Bytes from the end of each log (``logs``).
    tail: int = 64 * 1024
    #: Include finished requests still remembered (``instances``).
    finished: bool = False


@wire
class AgentGpu(WireModel):
    """One GPU model of the cluster and its use."""

    name: str
    capacity: int
    allocated: int
    discovered: str  # "nvidia-smi" or "static"


@wire
class AgentCluster(WireModel):
    """``cluster``: who the agent is and what it holds."""

    cluster_id: str
    cluster_name: str
    cluster_group_name: str
    region: str
    backend: str
    gpus: tuple[AgentGpu, ...]
    instances: int
    registered_at: str | None = None
    last_heartbeat_at: str | None = None


@wire
class AgentInstanceView(WireModel):
    """One instance as ``instances`` lists it."""

    request_id: str
    request_status: RequestStatus
    instance: AgentInstance
    #: None for a task's instance (null fields are left out of the JSON, so they need defaults).
    function_id: str | None = None
    function_version_id: str | None = None
    task_id: str | None = None


@wire
class AgentInstances(WireModel):
    """``instances``: what the agent holds."""

    cluster_id: str
    instances: tuple[AgentInstanceView, ...]


@wire
class AgentLog(WireModel):
    """The end of one log of an instance."""

    name: str  # "inference" or "worker"
    path: str
    text: str
    size: int


@wire
class AgentLogs(WireModel):
    """``logs``: the ends of an instance's logs."""

    instance_id: str
    logs: tuple[AgentLog, ...]
