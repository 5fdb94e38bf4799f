"""Instances and clusters as their agents see them: a cluster's live status, instance listings, instance logs.

The control plane's ledger says which instances it asked for and where; the cluster agent holding
them answers the rest (state, restarts, logs) over the bus (``nvcf.agent.<call>.<clusterId>``), each
call under a deadline so a cluster whose agent is gone gives a clear 503/504 instead of a hang.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar

import anyio

from nvcf_mono.auth import scopes as S
from nvcf_mono.bus.errors import BusError, NoResponders, RequestTimeout
from nvcf_mono.bus.mirror import Unchanged
from nvcf_mono.contracts import buckets, rpc, subjects
from nvcf_mono.contracts.agent import (
    AgentCluster,
    AgentInstance,
    AgentInstances,
    AgentInstanceView,
    AgentLogs,
    AgentQuery,
)
from nvcf_mono.contracts.rpc import RpcError
from nvcf_mono.http.api import Call, Param, Routes
from nvcf_mono.http.problem import ProblemError
from nvcf_mono.models.cluster import Cluster
from nvcf_mono.models.common import utc_now
from nvcf_mono.models.placement import Phase, PlacedInstance, PlacementFailure, SpecPlacement
from nvcf_mono.planes.control.catalog import health_of, is_heard, visible_clusters
from nvcf_mono.planes.control.context import Control
from nvcf_mono.planes.control.reconcile.plan import terminate_instance
from nvcf_mono.planes.control.service import find_version, owned_version
from nvcf_mono.structure import WireModel, evolve, wire

R = TypeVar("R")

TAG = "instances"
routes: Routes[Control] = Routes()
TAG_ICMS = "clusters (ICMS)"
#: How long one agent gets to answer (it answers from memory; more means it is stuck or gone).
AGENT_TIMEOUT = 5.0
#: Listings ask every cluster involved at once; a slow one only loses its live fields.
LISTING_TIMEOUT = 3.0
DEFAULT_TAIL = 64 * 1024
MAX_TAIL = 4 * 1024 * 1024
LOG_NAMES = ("inference", "worker")
_STATUS = {
    Phase.REQUESTED: "STARTING",
    Phase.ACKNOWLEDGED: "STARTING",
    Phase.STARTING: "STARTING",
    Phase.RUNNING: "ACTIVE",
}


# ---- responses -------------------------------------------------------------------------------------


@wire
class InstanceDetails(WireModel):
    """An instance: the ``activeInstances`` fields, where it runs, and its agent's live view."""

    instance_id: str
    function_id: str
    function_version_id: str
    instance_type: str
    #: ACTIVE, STARTING or ERRORED (a recent failure the control plane keeps for ``healthInfo``).
    instance_status: str
    icms_request_id: str
    nca_id: str
    gpu: str
    backend: str
    cluster_id: str
    cluster_name: str | None = None
    location: str | None = None
    instance_created_at: str | None = None
    instance_updated_at: str | None = None
    #: From the agent: ``instanceState`` (starting, running, terminated, a failure state) and ``status``.
    instance_state: str | None = None
    status: str | None = None
    restarts: int | None = None
    devices: tuple[int, ...] | None = None
    launched_at: str | None = None
    ready_at: str | None = None
    termination_cause: str | None = None
    error_source: str | None = None
    #: Why an ERRORED instance failed.
    error: str | None = None


@wire
class InstanceListResponse(WireModel):
    """``{instances}``; ``unreachableClusters`` names clusters whose agents did not answer (no live fields)."""

    instances: tuple[InstanceDetails, ...]
    unreachable_clusters: tuple[str, ...] | None = None


@wire
class InstanceLog(WireModel):
    """The end of one of an instance's logs."""

    name: str
    text: str
    #: The whole log's size in bytes; ``truncated`` when ``text`` is only its end.
    size: int
    truncated: bool


@wire
class InstanceLogsResponse(WireModel):
    """The ends of an instance's logs (``inference``: the function's server; ``worker``: its sidecar)."""

    instance_id: str
    function_id: str
    function_version_id: str
    cluster_id: str
    instance_state: str
    logs: tuple[InstanceLog, ...]
    cluster_name: str | None = None
    #: A task's instance: its task (and no function).
    task_id: str | None = None


@wire
class ClusterGpuStatus(WireModel):
    """One GPU model of a cluster and its use, as the agent counts it."""

    name: str
    capacity: int
    allocated: int
    available: int
    discovered: str


@wire
class ClusterInstance(WireModel):
    """An instance a cluster's agent holds."""

    instance_id: str
    icms_request_id: str
    request_status: str
    instance_state: str
    status: str
    created_at: str
    function_id: str | None = None
    function_version_id: str | None = None
    #: A task's instance: the task.
    task_id: str | None = None
    nca_id: str | None = None
    restarts: int | None = None
    devices: tuple[int, ...] | None = None
    ready_at: str | None = None
    termination_cause: str | None = None


@wire
class ClusterStatusResponse(WireModel):
    """A cluster as its agent sees it now: GPUs used and free, and the instances it runs."""

    cluster_id: str
    cluster_name: str
    cluster_group_name: str
    region: str
    #: healthy/unhealthy from the heartbeats, and the maintenance mode, as in the cluster listing.
    status: str
    backend: str
    gpus: tuple[ClusterGpuStatus, ...]
    instance_count: int
    instances: tuple[ClusterInstance, ...]
    maintenance_mode: str | None = None
    registered_at: str | None = None
    last_heartbeat_at: str | None = None


# ---- helpers ---------------------------------------------------------------------------------------


def _live(view: AgentInstanceView | None, details: InstanceDetails) -> InstanceDetails:
    """The ledger's row with what the agent holding the instance says about it now."""
    if view is None:
        return details
    inst = view.instance
    return evolve(
        details,
        instance_id=inst.instance_id,
        instance_state=inst.state,
        status=inst.status,
        restarts=inst.restarts,
        devices=inst.devices,
        launched_at=inst.launched_at,
        ready_at=inst.ready_at or details.ready_at,
        termination_cause=inst.termination_cause or details.termination_cause,
        error_source=inst.error_source,
    )


def _placed(ledger: SpecPlacement, inst: PlacedInstance, status: str) -> InstanceDetails:
    return InstanceDetails(
        instance_id=inst.instance_id or inst.request_id,
        function_id=ledger.function_id,
        function_version_id=ledger.function_version_id,
        instance_type=inst.instance_type,
        instance_status=status,
        icms_request_id=inst.request_id,
        nca_id=ledger.nca_id,
        gpu=inst.gpu,
        backend=inst.backend,
        cluster_id=inst.cluster_id,
        cluster_name=inst.cluster_name,
        location=inst.region,
        instance_created_at=inst.created_at,
        instance_updated_at=inst.updated_at,
        instance_state=inst.instance_state,
        ready_at=inst.ready_at,
    )


def _failed(ledger: SpecPlacement, failure: PlacementFailure, cluster_name: str | None) -> InstanceDetails:
    return InstanceDetails(
        instance_id=failure.instance_id or failure.request_id,
        function_id=ledger.function_id,
        function_version_id=ledger.function_version_id,
        instance_type=failure.instance_type,
        instance_status="ERRORED",
        icms_request_id=failure.request_id,
        nca_id=ledger.nca_id,
        gpu=failure.gpu,
        backend=failure.backend,
        cluster_id=failure.cluster_id,
        cluster_name=cluster_name,
        instance_updated_at=failure.at,
        termination_cause=failure.cause,
        error=failure.error,
    )


def _cluster_instance(view: AgentInstanceView, nca_id: str | None) -> ClusterInstance:
    inst: AgentInstance = view.instance
    return ClusterInstance(
        instance_id=inst.instance_id,
        icms_request_id=view.request_id,
        request_status=view.request_status.value,
        instance_state=inst.state,
        status=inst.status,
        created_at=inst.created_at,
        function_id=view.function_id,
        function_version_id=view.function_version_id,
        task_id=view.task_id,
        nca_id=nca_id,
        restarts=inst.restarts,
        devices=inst.devices,
        ready_at=inst.ready_at,
        termination_cause=inst.termination_cause,
    )


def cluster_name(ctl: Control, cluster_id: str) -> str:
    cluster = ctl.store.clusters.get(cluster_id)
    return cluster.cluster_name if cluster else cluster_id


def cluster_label(ctl: Control, cluster_id: str) -> str:
    cluster = ctl.store.clusters.get(cluster_id)
    return f"'{cluster.cluster_name}' ({cluster_id})" if cluster else f"'{cluster_id}'"


async def ask(
    ctl: Control,
    what: subjects.AgentCall,
    cluster_id: str,
    query: AgentQuery,
    reply: type[R],
    *,
    timeout: float = AGENT_TIMEOUT,
) -> R:
    """One agent call; the bus's failures become problems that say which cluster and why."""
    where = cluster_label(ctl, cluster_id)
    subject = subjects.agent_subject(what, cluster_id)
    try:
        return await rpc.call(ctl.bus, subject, query, reply, timeout=timeout)
    except NoResponders:
        raise ProblemError(
            503, f"the agent of cluster {where} is not connected: no agent answers for it on the bus"
        ) from None
    except RequestTimeout:
        raise ProblemError(504, f"the agent of cluster {where} did not answer within {timeout:g}s") from None
    except RpcError as err:
        if err.code in (400, 404):
            raise ProblemError(err.code, err.message) from None
        raise ProblemError(503, f"the agent of cluster {where} failed to answer: {err.message}") from None
    except BusError as err:
        raise ProblemError(503, f"cannot reach the agent of cluster {where}: {err}") from None


async def held(
    ctl: Control, cluster_ids: Iterable[str], query: AgentQuery
) -> tuple[dict[str, AgentInstances], list[str]]:
    """What each cluster's agent holds, asked at once; the clusters that did not answer."""
    answers: dict[str, AgentInstances] = {}
    failed: list[str] = []

    async def one(cluster_id: str) -> None:
        try:
            answers[cluster_id] = await ask(
                ctl, "instances", cluster_id, query, AgentInstances, timeout=LISTING_TIMEOUT
            )
        except ProblemError:
            failed.append(cluster_id)

    async with anyio.create_task_group() as tg:
        for cluster_id in sorted(set(cluster_ids)):
            tg.start_soon(one, cluster_id)
    return answers, failed


def mine(call: Call[Any], ledger: SpecPlacement) -> bool:
    """The account's own deployment, within the key's resources (instances are the owner's to see)."""
    if ledger.nca_id != call.account:
        return False
    res = call.principal.resources
    return res is None or res.allows_function(ledger.function_id, ledger.function_version_id, own_account=True)


def find_cluster(ctl: Control, call: Call[Any], wanted: str) -> set[str]:
    """Ids of the clusters a ``cluster`` filter (name or id) names; 404 when none is known."""
    known = {c.cluster_id: c.cluster_name for c in visible_clusters(ctl.store.clusters.values(), call.account)}
    for ledger in ctl.store.placements.values():
        if mine(call, ledger):
            known.update({i.cluster_id: i.cluster_name for i in ledger.instances})
    found = {cid for cid, name in known.items() if wanted in (cid, name) or wanted.lower() == name.lower()}
    if not found:
        raise ProblemError(404, f"Cluster '{wanted}' not found")
    return found


async def listing(
    ctl: Control, call: Call[Any], ledgers: Iterable[SpecPlacement], clusters: set[str] | None
) -> InstanceListResponse:
    rows: list[InstanceDetails] = []
    for ledger in ledgers:
        seen: set[str] = set()
        for inst in ledger.instances:
            status = _STATUS.get(inst.phase)
            if status is None:
                continue  # being terminated: no longer the deployment's
            seen.add(inst.request_id)
            rows.append(_placed(ledger, inst, status))
        for failure in ledger.failures:
            if failure.request_id not in seen:
                cluster = ctl.store.clusters.get(failure.cluster_id)
                rows.append(_failed(ledger, failure, cluster.cluster_name if cluster else None))
    if clusters is not None:
        rows = [r for r in rows if r.cluster_id in clusters]
    answers, failed = await held(ctl, (r.cluster_id for r in rows), AgentQuery(finished=True))
    views: dict[tuple[str, str], AgentInstanceView] = {}
    for cluster_id, answer in answers.items():
        for view in answer.instances:
            views[(cluster_id, view.request_id)] = view
    out = [_live(views.get((r.cluster_id, r.icms_request_id)), r) for r in rows]
    out.sort(key=lambda r: (r.function_id, r.function_version_id, r.instance_created_at or "", r.instance_id))
    return InstanceListResponse(
        instances=tuple(out),
        unreachable_clusters=tuple(cluster_name(ctl, c) for c in sorted(failed)) or None,
    )


# ---- instances ---------------------------------------------------------------------------------


@routes.route(
    "GET",
    "/v2/nvcf/instances",
    summary="The account's function instances, with their clusters' live view of each.",
    description="Instances the control plane placed (STARTING, ACTIVE) and recent failures (ERRORED).",
    tag=TAG,
    scopes=(S.LIST_FUNCTIONS_DETAILS,),
    response=InstanceListResponse,
    params=(
        Param(name="functionId", description="Only this function's instances."),
        Param(name="functionVersionId", description="Only this version's (needs functionId)."),
        Param(name="cluster", description="Only instances on this cluster (name or id)."),
    ),
    errors=(404,),
    cross_account=True,
)
async def list_instances(ctl: Control, call: Call[None]) -> InstanceListResponse:
    fid, vid = call.query("functionId"), call.query("functionVersionId")
    if vid and not fid:
        raise ProblemError(400, "'functionVersionId' needs 'functionId'")
    if fid and vid:
        await find_version(ctl, call.principal, call.account, fid, vid, owner_only=True)
    elif fid:
        versions = [fv for fv in ctl.store.versions_of(fid) if fv.nca_id == call.account]
        if not versions:
            raise ProblemError(404, f"Function '{fid}' not found")
    wanted = call.query("cluster")
    clusters = find_cluster(ctl, call, wanted) if wanted else None
    ledgers = [
        ledger
        for ledger in ctl.store.placements.values()
        if mine(call, ledger)
        and (not fid or ledger.function_id == fid)
        and (not vid or ledger.function_version_id == vid)
    ]
    return await listing(ctl, call, ledgers, clusters)


@routes.route(
    "DELETE",
    "/v2/nvcf/instances/{instanceId}",
    summary="Terminate one function instance (super admins); its deployment starts a replacement if it "
    "still needs one.",
    description="Requests it is serving are delivered again elsewhere. 404 for an instance that is not "
    "running or starting (unknown, already terminating, or a task's).",
    tag=TAG,
    scopes=(f"admin:{S.DELETE_FUNCTION}",),
    errors=(404,),
)
async def terminate_function_instance(ctl: Control, call: Call[None]) -> None:
    instance_id = call.path("instanceId")
    gone = ProblemError(404, f"Instance '{instance_id}' not found among running or starting function instances")
    key = next(
        (k for k, ledger in ctl.store.placements.items() if any(i.instance_id == instance_id for i in ledger.live())),
        None,
    )
    if key is None:
        raise gone
    now = utc_now()

    def terminate(current: SpecPlacement | None) -> SpecPlacement:
        updated = None if current is None else terminate_instance(current, instance_id, "terminated-by-admin", now)
        if updated is None:
            raise Unchanged
        return updated

    found = await ctl.store.placements.mutate(key, terminate)
    if found is None or not any(i.instance_id == instance_id and i.phase is Phase.TERMINATING for i in found.instances):
        raise gone  # it went away meanwhile


@routes.route(
    "GET",
    "/v2/nvcf/functions/{functionId}/versions/{versionId}/instances",
    summary="A function version's instances, with their clusters' live view of each.",
    tag=TAG,
    scopes=(S.LIST_FUNCTIONS_DETAILS,),
    response=InstanceListResponse,
    errors=(404,),
    cross_account=True,
)
async def list_version_instances(ctl: Control, call: Call[None]) -> InstanceListResponse:
    fv = await owned_version(ctl, call)
    return await listing(ctl, call, ctl.store.placements_of(fv.version_id), None)


async def locate(ctl: Control, call: Call[Any], instance_id: str) -> tuple[str, AgentInstanceView]:
    """The cluster holding one of the caller's instances, and the agent's view of it; 404 otherwise."""
    candidates: list[str] = []
    for ledger in ctl.store.placements.values():
        if not mine(call, ledger):
            continue
        candidates += [i.cluster_id for i in ledger.instances if instance_id in (i.instance_id, i.request_id)]
        candidates += [f.cluster_id for f in ledger.failures if instance_id in (f.instance_id, f.request_id)]
    # A task's instance (the task's own key may read it: tasks have no function scopes).
    tasks = {t.request_id: t for t in ctl.store.tasks.values() if t.nca_id == call.account and t.request_id}
    for task in tasks.values():
        if task.cluster_id and instance_id in (task.request_id, *(i.instance_id for i in task.instances)):
            candidates.append(task.cluster_id)
    ledger_known = bool(candidates)
    if not candidates:
        # Gone from the ledger (undeployed, old failure): the agents still remember it a while.
        ttl = ctl.config.cluster_heartbeat_ttl
        candidates = [
            c.cluster_id
            for c in visible_clusters(ctl.store.clusters.values(), call.account)
            if is_heard(ctl.store.health.get(c.cluster_id), ttl)  # a cordoned agent still answers
        ]
    answers, _ = await held(ctl, candidates, AgentQuery(instance_id=instance_id, finished=True))
    functions_too = call.principal.has(S.LIST_FUNCTIONS_DETAILS) or call.principal.has(
        f"admin:{S.LIST_FUNCTIONS_DETAILS}"
    )
    for cluster_id, answer in answers.items():
        for view in answer.instances:
            owner = tasks.get(view.request_id)
            if owner is not None and (
                call.principal.resources is None or call.principal.resources.allows_task(owner.id)
            ):
                return cluster_id, view
            if view.function_id is None or view.function_version_id is None or not functions_too:
                continue
            fv = ctl.store.functions.get(buckets.version_key(view.function_id, view.function_version_id))
            res = call.principal.resources
            if (
                fv is not None
                and fv.nca_id == call.account
                and (res is None or res.allows_function(fv.id, fv.version_id, own_account=True))
            ):
                return cluster_id, view
    if candidates and len(answers) < len(set(candidates)):
        missing = sorted(set(candidates) - set(answers))
        raise ProblemError(
            503,
            f"instance '{instance_id}' may be on cluster {', '.join(cluster_label(ctl, c) for c in missing)}, "
            "whose agent did not answer; try again",
        )
    if ledger_known:
        where = ", ".join(cluster_label(ctl, c) for c in sorted(set(candidates)))
        raise ProblemError(
            404, f"Instance '{instance_id}' is not on cluster {where} (not started yet, or long gone): no logs"
        )
    raise ProblemError(404, f"Instance '{instance_id}' not found")


@routes.route(
    "GET",
    "/v2/nvcf/instances/{instanceId}/logs",
    summary="The end of an instance's logs (its inference server's and its worker's), read by its cluster's agent.",
    tag=TAG,
    scopes=(S.LIST_FUNCTIONS_DETAILS, S.TASK_DETAILS),
    response=InstanceLogsResponse,
    params=(
        Param(
            name="tail",
            description=f"Bytes from the end of each log (default {DEFAULT_TAIL}, at most {MAX_TAIL}).",
            schema={"type": "integer", "minimum": 0, "maximum": MAX_TAIL},
        ),
        Param(
            name="lines",
            description="Only the last N lines of what 'tail' returned.",
            schema={"type": "integer", "minimum": 0},
        ),
        Param(name="log", description="Only this log: inference or worker."),
    ),
    errors=(404, 503, 504),
    cross_account=True,
)
async def get_instance_logs(ctl: Control, call: Call[None]) -> InstanceLogsResponse:
    tail = call.query_int("tail", DEFAULT_TAIL, lo=0, hi=MAX_TAIL)
    lines = call.query_int("lines", -1, lo=0, hi=1_000_000) if call.query("lines") else None
    only = call.query("log")
    if only is not None and only not in LOG_NAMES:
        raise ProblemError(400, f"query parameter 'log' must be one of {', '.join(LOG_NAMES)}, got {only!r}")
    instance_id = call.path("instanceId")
    cluster_id, view = await locate(ctl, call, instance_id)
    found = await ask(ctl, "logs", cluster_id, AgentQuery(instance_id=view.instance.instance_id, tail=tail), AgentLogs)
    logs = []
    for log in found.logs:
        if only is not None and log.name != only:
            continue
        text = log.text
        if lines is not None:
            kept = text.splitlines(keepends=True)[-lines:] if lines else []
            text = "".join(kept)
        logs.append(InstanceLog(name=log.name, text=text, size=log.size, truncated=len(text.encode()) < log.size))
    cluster = ctl.store.clusters.get(cluster_id)
    task = next((t for t in ctl.store.tasks.values() if t.request_id == view.request_id), None)
    return InstanceLogsResponse(
        task_id=task.id if task is not None else None,
        instance_id=view.instance.instance_id,
        function_id=view.function_id or "",
        function_version_id=view.function_version_id or "",
        cluster_id=cluster_id,
        cluster_name=cluster.cluster_name if cluster else None,
        instance_state=view.instance.state,
        logs=tuple(logs),
    )


# ---- cluster status ----------------------------------------------------------------------------


def owned(ctl: Control, call: Call[Any]) -> Cluster:
    nca_id = call.account
    if nca_id != call.principal.account and not call.principal.super_admin:
        raise ProblemError(404, f"account {nca_id!r} not found")
    cluster_id = call.path("clusterId")
    cluster = ctl.store.clusters.get(cluster_id)
    if cluster is None or cluster.nca_id != nca_id:
        raise ProblemError(404, f"Cluster '{cluster_id}' not found")
    return cluster


@routes.route(
    "GET",
    "/v1/accounts/{ncaId}/clusters/{clusterId}/status",
    account_from_path=True,
    summary="A cluster as its agent sees it now: GPUs used and free, and the instances it runs.",
    tag=TAG_ICMS,
    scopes=(S.CLUSTER_MANAGEMENT, S.CLUSTER_LISTING),
    response=ClusterStatusResponse,
    errors=(404, 503, 504),
)
async def get_cluster_status(ctl: Control, call: Call[None]) -> ClusterStatusResponse:
    cluster = owned(ctl, call)
    live = await ask(ctl, "cluster", cluster.cluster_id, AgentQuery(), AgentCluster)
    held_now = await ask(ctl, "instances", cluster.cluster_id, AgentQuery(), AgentInstances)

    def owner(view: AgentInstanceView) -> str | None:
        if view.task_id is not None:
            task = ctl.store.tasks.get(view.task_id)
            return task.nca_id if task else None
        if view.function_id is None or view.function_version_id is None:
            return None
        fv = ctl.store.functions.get(buckets.version_key(view.function_id, view.function_version_id))
        return fv.nca_id if fv else None

    status, maintenance = health_of(ctl.store.health.get(cluster.cluster_id), ctl.config.cluster_heartbeat_ttl)
    return ClusterStatusResponse(
        cluster_id=cluster.cluster_id,
        cluster_name=cluster.cluster_name,
        cluster_group_name=cluster.cluster_group_name,
        region=cluster.region,
        status=status,
        maintenance_mode=maintenance,
        backend=live.backend,
        gpus=tuple(
            ClusterGpuStatus(
                name=g.name,
                capacity=g.capacity,
                allocated=g.allocated,
                available=max(0, g.capacity - g.allocated),
                discovered=g.discovered,
            )
            for g in live.gpus
        ),
        instance_count=live.instances,
        instances=tuple(
            _cluster_instance(v, owner(v))
            for v in sorted(held_now.instances, key=lambda v: (v.instance.created_at, v.instance.instance_id))
        ),
        registered_at=live.registered_at,
        last_heartbeat_at=live.last_heartbeat_at,
    )
