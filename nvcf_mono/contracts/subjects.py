"""NATS subjects that cross plane boundaries, built in one place.

The creation/termination subjects, stream names and durables are NVCF's own (seed ``000_*``,
reference compute-plane §1); the ``nvcf.icms.*`` subjects carry what NVCA sends ICMS over REST in
NVCF (registration, heartbeat, request acks, instance status), here as request/reply on the bus.
"""

from __future__ import annotations

from typing import Literal

WorkloadKind = Literal["Function", "Task"]

CREATE_STREAM = "CreateNvcaFunctionTaskStream"
TERMINATE_STREAM = "TerminateNvcaStream"


def instance_type_token(instance_type: str) -> str:
    """An instance type as one subject token: ``NCP.GPU.H100_1x`` -> ``NCP|GPU|H100_1x``."""
    return instance_type.replace(".", "|")


def create_subject(kind: WorkloadKind, cluster_id: str, gpu: str, instance_type: str) -> str:
    """``Create.NVCA.{Function|Task}.<clusterId>.<gpu>.<instanceType with '.'->'|'>``."""
    return f"Create.NVCA.{kind}.{cluster_id}.{gpu}.{instance_type_token(instance_type)}"


def create_filter(cluster_id: str) -> str:
    """What one cluster's agent consumes from the creation stream."""
    return f"Create.NVCA.*.{cluster_id}.*.*"


def terminate_subject(cluster_id: str) -> str:
    """``Terminate.NVCA.<clusterId>``."""
    return f"Terminate.NVCA.{cluster_id}"


def agent_durable(stream: str, cluster_id: str) -> str:
    """The durable consumer of one cluster on a stream: ``<stream>-<clusterId>``."""
    return f"{stream}-{cluster_id}"


# ---- agent -> control plane (ICMS over the bus; request/reply, served by a queue group) ----------

ICMS_QUEUE = "nvcf-control"
ICMS_ALL = "nvcf.icms.>"
IcmsCall = Literal["register", "heartbeat", "ack", "status", "instances"]


def icms_subject(call: IcmsCall, cluster_id: str) -> str:
    """``nvcf.icms.<call>.<clusterId>``: register, heartbeat, ack, status, instances."""
    return f"nvcf.icms.{call}.{cluster_id}"


def icms_call_of(subject: str) -> tuple[str, str]:
    """``(call, clusterId)`` of an ``nvcf.icms.*`` subject."""
    parts = subject.split(".")
    if len(parts) != 4 or parts[:2] != ["nvcf", "icms"]:
        raise ValueError(f"not an ICMS subject: {subject!r}")
    return parts[2], parts[3]


# ---- instances -> control plane -------------------------------------------------------------------

#: Secrets of a function version or task, fetched at launch with the instance's worker token.
SECRETS_FETCH = "nvcf.control.secrets"

TaskCall = Literal["connect", "heartbeat", "room", "result"]
#: What task workers send (through their invocation node): ``nvcf.task.<call>``.
TASK_CALLS = "nvcf.task.>"


def task_subject(call: TaskCall) -> str:
    return f"nvcf.task.{call}"


# ---- invocation -----------------------------------------------------------------------------------


def request_stream(region: str, function_version_id: str) -> str:
    """The durable buffer of one function version in one region: ``rq_<region>_<fvid>``."""
    return f"rq_{region}_{function_version_id}"


def request_streams_filter(region: str) -> str:
    """Every request of every version in one region (finds the region's request streams)."""
    return f"rq.{region}.>"


def version_of_request_stream(region: str, stream: str) -> str | None:
    """The version id of a request stream of ``region`` (None for any other stream)."""
    prefix = request_stream(region, "")
    return stream[len(prefix) :] or None if stream.startswith(prefix) else None


def request_subject(region: str, function_version_id: str, request_id: str) -> str:
    """``rq.<region>.<fvid>.<requestId>``."""
    return f"rq.{region}.{function_version_id}.{request_id}"


def request_filter(region: str, function_version_id: str) -> str:
    """Every request of one version in one region."""
    return f"rq.{region}.{function_version_id}.>"


def worker_durable(region: str, function_version_id: str) -> str:
    """The durable consumer workers of a version pull from: ``rq_<region>_<fvid>_workers``."""
    return f"rq_{region}_{function_version_id}_workers"


def cancel_subject(function_version_id: str) -> str:
    """``nvcf.cancel.<fvid>``: payload is the request id to stop."""
    return f"nvcf.cancel.{function_version_id}"


#: Invocation nodes tell each other which of their instances took a conversation's turn (session affinity).
AFFINITY_TOOK = "nvcf.affinity.took"


#: Invocation nodes tell each other what the LLM gateway's calls took from their limits.
LLM_GATEWAY_TAKEN = "nvcf.llm.taken"


def affinity_take_subject(node: str) -> str:
    """``nvcf.affinity.take.<node>``: another node hands a turn to an instance connected to this node."""
    return f"nvcf.affinity.take.{node}"


def response_prefix(inbox: str) -> str:
    """Where an invocation node receives response frames: ``nvcf.resp.<inbox>``."""
    return f"nvcf.resp.{inbox.replace('.', '_')}"


def response_subject(inbox: str, request_id: str, capability: str) -> str:
    """``nvcf.resp.<inbox>.<requestId>.<capability>``: the frames of one request.

    The capability is a token only the request's holders see (it travels inside the request); the
    receiving node takes no frame without it, so knowing a request id is not enough to answer it.
    """
    return f"{response_prefix(inbox)}.{request_id}.{capability}"


#: Any response subject (what a worker on the nats transport may publish to).
RESPONSE_SUBJECTS = response_prefix("*") + ".*.*"


def input_subject(reply: str) -> str:
    """``nvcf.input.<inbox>.<requestId>.<capability>``: the live input of the request answered on ``reply``
    (a response subject), served by the same node with the same capability (contracts/live_input.py).
    """
    return INPUT_ROOT + reply[len(RESPONSE_ROOT) :] if reply.startswith(RESPONSE_ROOT) else ""


def input_prefix(inbox: str) -> str:
    """Where an invocation node answers for its requests' live input: ``nvcf.input.<inbox>``."""
    return INPUT_ROOT + response_prefix(inbox)[len(RESPONSE_ROOT) :]


RESPONSE_ROOT = "nvcf.resp."
INPUT_ROOT = "nvcf.input."
#: Any live input subject (what a worker on the nats transport may ask on).
INPUT_SUBJECTS = input_prefix("*") + ".*.*"


def response_capability(reply: str) -> str:
    """The capability of a response subject (its last token)."""
    return reply.rsplit(".", 1)[-1]


#: Root of the NATS inboxes of worker sessions on the nats transport; each session has its own
#: prefix under it and may subscribe there only (the platform's own inboxes are ``_INBOX.*``).
WORKER_INBOX_ROOT = "_INBOX_WORKER"


def worker_inbox(session: str) -> str:
    """``_INBOX_WORKER.<session>``: the inbox prefix of one worker session (its replies and pulls)."""
    return f"{WORKER_INBOX_ROOT}.{session}"


# ---- anyone -> a cluster agent (request/reply; the CLI's instance list and logs) -----------------

AgentCall = Literal["cluster", "instances", "logs"]


def agent_subject(call: AgentCall, cluster_id: str) -> str:
    """``nvcf.agent.<call>.<clusterId>``: cluster, instances, logs (answered by that cluster's agent)."""
    return f"nvcf.agent.{call}.{cluster_id}"


def agent_call_of(subject: str) -> tuple[str, str]:
    """``(call, clusterId)`` of an ``nvcf.agent.*`` subject."""
    parts = subject.split(".")
    if len(parts) != 4 or parts[:2] != ["nvcf", "agent"]:
        raise ValueError(f"not an agent subject: {subject!r}")
    return parts[2], parts[3]


def agent_calls(cluster_id: str) -> str:
    """Every call one cluster's agent answers."""
    return f"nvcf.agent.*.{cluster_id}"
