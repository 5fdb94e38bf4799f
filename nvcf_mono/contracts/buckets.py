"""KV buckets and object stores that cross plane boundaries: spec, key layout, value schema.

Values are stored with :class:`~nvcf_mono.bus.codec.VersionedCodec` (``{"v": N, "data": ...}``);
bump a codec's version and add an upgrade when a stored shape changes incompatibly.
"""

from __future__ import annotations

import base64
import re
from typing import Any

from nvcf_mono.bus.api import BucketSpec, KeyValue, ObjectStoreSpec
from nvcf_mono.bus.codec import TypedKV, VersionedCodec
from nvcf_mono.contracts.agent import AgentRequest
from nvcf_mono.models.account import Account
from nvcf_mono.models.api_key import ApiKeyRecord
from nvcf_mono.models.asset import Asset
from nvcf_mono.models.cluster import Cluster, ClusterHeartbeat
from nvcf_mono.models.deployment import Deployment
from nvcf_mono.models.function import FunctionVersion
from nvcf_mono.models.placement import SpecPlacement
from nvcf_mono.models.secret import SealedSecrets, StoredRegistryCredential
from nvcf_mono.models.sharing import AuthorizedParties
from nvcf_mono.models.task import Task, TaskEvent, TaskResult
from nvcf_mono.models.telemetry import StoredTelemetry
from nvcf_mono.structure import WireModel, wire

# ---- specs ----------------------------------------------------------------------------------------

ACCOUNTS = BucketSpec(name="nvcf_accounts", description="Accounts (key: <ncaId>).", history=5)
FUNCTIONS = BucketSpec(name="nvcf_functions", description="Function versions (key: <fid>.<vid>).", history=5)
DEPLOYMENTS = BucketSpec(name="nvcf_deployments", description="Deployments (key: <fid>.<vid>).", history=5)
PLACEMENTS = BucketSpec(
    name="nvcf_placements",
    description="Instance requests per GPU spec (key: <fvid>.<gpuSpecificationId>).",
    history=3,
)
AUTOSCALER = BucketSpec(
    name="nvcf_autoscaler",
    description="The autoscaler's desired instances per GPU spec (key: <fvid>.<gpuSpecificationId>).",
)
CLUSTERS = BucketSpec(name="nvcf_clusters", description="Registered clusters (key: <clusterId>).", history=3)
CLUSTER_HEALTH = BucketSpec(
    name="nvcf_cluster_health",
    description="Last heartbeat per cluster (key: <clusterId>); it expires when heartbeats stop.",
    per_key_ttl=True,
)
API_KEYS = BucketSpec(name="nvcf_api_keys", description="API keys by hash (key: <hash>); no secret is stored.")
SECRETS = BucketSpec(
    name="nvcf_secrets",
    description="Sealed secrets (key: fn.<fid>.<vid>, task.<taskId> or acct.<ncaId>).",
)
REGISTRY_CREDENTIALS = BucketSpec(
    name="nvcf_registry_credentials", description="Registry credentials (key: <ncaId>.<credentialId>)."
)
TELEMETRIES = BucketSpec(name="nvcf_telemetries", description="Telemetry endpoints (key: <ncaId>.<telemetryId>).")
AUTHORIZATIONS = BucketSpec(name="nvcf_authorizations", description="Function sharing (key: <fid> or <fid>.<vid>).")
ASSETS = BucketSpec(name="nvcf_assets", description="Asset metadata (key: <ncaId>.<assetId>).")
ASSET_CONTENT = ObjectStoreSpec(name="nvcf_assets", description="Asset content (name: <ncaId>/<assetId>).")
REQUESTS = BucketSpec(
    name="nvcf_requests",
    description="Invocation requests in flight or with a kept result (key: <requestId>); written by the "
    "invocation plane, read by the queue endpoints.",
    per_key_ttl=True,
)
RESULTS = BucketSpec(
    name="nvcf_results",
    description="Results of requests that answered 202, until fetched or expired (key: <requestId>).",
    per_key_ttl=True,
)
IDEMPOTENCY = BucketSpec(
    name="nvcf_idempotency",
    description="Idempotency-Key -> request id (key: <ncaId>.<fid>.<sha256 of the key>).",
    per_key_ttl=True,
)
PAYLOADS = ObjectStoreSpec(
    name="nvcf_payloads",
    description="Large request bodies and 202 results (names: req/<requestId>, res/<requestId>).",
    ttl=24 * 3600.0,
)
TASKS = BucketSpec(name="nvcf_tasks", description="Tasks (key: <taskId>).", history=3)
TASK_EVENTS = BucketSpec(
    name="nvcf_task_events", description="Task events in order (key: <taskId>.<sequence, 8 digits>)."
)
TASK_RESULTS = BucketSpec(name="nvcf_task_results", description="Task result metadata (key: <taskId>.<resultId>).")
TASK_RESULT_CONTENT = ObjectStoreSpec(
    name="nvcf_task_results", description="Task result content, UPLOAD strategy (name: <taskId>/<resultId>)."
)
LEASES = BucketSpec(
    name="nvcf_leases", description="Leader leases (key: <role>); a lease expires unless renewed.", per_key_ttl=True
)

# ---- codecs ---------------------------------------------------------------------------------------

ACCOUNT = VersionedCodec(Account, 1, "account")
FUNCTION = VersionedCodec(FunctionVersion, 1, "function version")
DEPLOYMENT = VersionedCodec(Deployment, 1, "deployment")
PLACEMENT = VersionedCodec(SpecPlacement, 1, "placement")
CLUSTER = VersionedCodec(Cluster, 1, "cluster")
HEARTBEAT = VersionedCodec(ClusterHeartbeat, 1, "cluster heartbeat")
API_KEY = VersionedCodec(ApiKeyRecord, 1, "api key")
SEALED_SECRETS = VersionedCodec(SealedSecrets, 1, "secrets")
REGISTRY_CREDENTIAL = VersionedCodec(StoredRegistryCredential, 1, "registry credential")
TELEMETRY = VersionedCodec(StoredTelemetry, 1, "telemetry")
AUTHORIZED_PARTIES = VersionedCodec(AuthorizedParties, 1, "authorized parties")
ASSET = VersionedCodec(Asset, 1, "asset")
TASK = VersionedCodec(Task, 1, "task")
TASK_EVENT = VersionedCodec(TaskEvent, 1, "task event")
TASK_RESULT = VersionedCodec(TaskResult, 1, "task result")


@wire
class AutoscalerTarget(WireModel):
    """What the autoscaler wants for one GPU spec, and why (written by the autoscaler)."""

    desired: int
    reason: str
    at: str
    #: When the version was last invoked, as far as the autoscaler knows (a new leader starts from it).
    last_invoked_at: str | None = None


@wire
class RequestRecord(WireModel):
    """Where an invocation request is: enough for the queue-position endpoint and status polls."""

    request_id: str
    function_id: str
    function_version_id: str
    nca_id: str
    region: str
    state: str  # queued, running, done
    created_at: str


@wire
class StoredResult(WireModel):
    """A finished response kept for a status poll: inline body, or an object in ``nvcf_payloads``."""

    request_id: str
    status: int
    headers: tuple[tuple[str, str], ...]
    finished_at: str
    body: str = ""  # base64 when inline
    body_object: str | None = None
    body_size: int = 0
    percent: int | None = None


@wire
class IdempotentRequest(WireModel):
    """The request an Idempotency-Key stands for."""

    request_id: str
    function_version_id: str
    created_at: str
    #: What its body was (``invocation.idempotency.fingerprint``): a retry with another body is refused.
    #: Empty in records written before it was kept: those are not compared.
    body_fingerprint: str = ""


@wire
class Lease(WireModel):
    """Who holds a leader lease."""

    holder: str
    acquired_at: str
    renewed_at: str


AUTOSCALER_TARGET = VersionedCodec(AutoscalerTarget, 1, "autoscaler target")
LEASE = VersionedCodec(Lease, 1, "lease")
REQUEST = VersionedCodec(RequestRecord, 1, "request")
RESULT = VersionedCodec(StoredResult, 1, "result")
IDEMPOTENT = VersionedCodec(IdempotentRequest, 1, "idempotent request")


def request_body_object(request_id: str) -> str:
    return f"req/{request_id}"


def result_body_object(request_id: str) -> str:
    return f"res/{request_id}"


# ---- keys -----------------------------------------------------------------------------------------


def version_key(function_id: str, version_id: str) -> str:
    """``<fid>.<vid>`` (functions, deployments)."""
    return f"{function_id}.{version_id}"


def spec_key(function_version_id: str, spec_id: str) -> str:
    """``<fvid>.<gpuSpecificationId>`` (placements, autoscaler)."""
    return f"{function_version_id}.{spec_id}"


def function_secrets_key(function_id: str, version_id: str) -> str:
    return f"fn.{function_id}.{version_id}"


def task_secrets_key(task_id: str) -> str:
    return f"task.{task_id}"


def account_secrets_key(nca_id: str) -> str:
    """An account's own secrets, delivered to every instance and task of the account."""
    return f"acct.{nca_id}"


def task_event_key(task_id: str, sequence: int) -> str:
    """``<taskId>.<sequence>``: zero-padded, so keys sort in event order."""
    return f"{task_id}.{sequence:08d}"


def task_item_pattern(task_id: str) -> str:
    """Every event (or result) of one task."""
    return f"{task_id}.*"


def task_result_object(task_id: str, result_id: str) -> str:
    return f"{task_id}/{result_id}"


def account_item_key(nca_id: str, item_id: str) -> str:
    """``<ncaId>.<id>`` (registry credentials, assets)."""
    return f"{nca_id}.{item_id}"


def asset_object(nca_id: str, asset_id: str) -> str:
    return f"{nca_id}/{asset_id}"


def idempotency_key(nca_id: str, function_id: str, key_sha256: str) -> str:
    """``<ncaId>.<fid>.<sha256 hex of the Idempotency-Key>`` (idempotency)."""
    return f"{nca_id}.{function_id}.{key_sha256}"


def typed(kv: KeyValue, codec: VersionedCodec[Any]) -> TypedKV[Any]:
    """A typed handle (``typed(bus.kv(FUNCTIONS.name), FUNCTION)``)."""
    return TypedKV(kv, codec)


# ---- rate limiting (invocation plane) -------------------------------------------------------------

RATE_LIMITS = BucketSpec(
    name="nvcf_rate_limits",
    description="Invocation rate-limit counters, one per fixed window, each expiring after its window (key: "
    "<ncaId>.<fvid>.<N>-<unit>.<window> or user.<subject>.<ncaId>.<fvid>.<N>-<unit>.<window>), and the live "
    "invocation nodes that share them (key: node.<node>).",
    per_key_ttl=True,
    # File storage like every other bucket: a restarted nats-server must still have it (a memory
    # bucket would be gone, and with it the watch of every invocation node).
)


@wire
class RateCount(WireModel):
    """Requests admitted in one rate-limit window by every invocation node together."""

    count: int


@wire
class RateLimiterNode(WireModel):
    """An invocation node taking part in rate limiting (its share of a window's headroom is 1/nodes)."""

    node: str
    seen_at: str


RATE_COUNT = VersionedCodec(RateCount, 1, "rate-limit count")
RATE_LIMITER_NODE = VersionedCodec(RateLimiterNode, 1, "rate-limiter node")
RATE_NODES_PATTERN = "node.*"
_RATE_TOKEN_RX = re.compile(r"[-_a-zA-Z0-9][-_=a-zA-Z0-9]*")


def rate_token(value: str) -> str:
    """``value`` as one KV key token: kept when it is safe, else ``=`` + unpadded base64url (never ambiguous)."""
    if _RATE_TOKEN_RX.fullmatch(value):
        return value
    return "=" + base64.urlsafe_b64encode(value.encode()).decode().rstrip("=")


def rate_account_key(nca_id: str, function_version_id: str, rate: str) -> str:
    """``<ncaId>.<fvid>.<N>-<unit>`` (NVCF's ``<ncaId>:<fvid>:<rate>``); a window index follows it."""
    return f"{rate_token(nca_id)}.{rate_token(function_version_id)}.{rate}"


def rate_user_key(subject: str, nca_id: str, function_version_id: str, rate: str) -> str:
    """``user.<subject>.<ncaId>.<fvid>.<N>-<unit>`` (NVCF's ``user:<subject>:<ncaId>:<fvid>:<rate>``)."""
    return f"user.{rate_token(subject)}.{rate_account_key(nca_id, function_version_id, rate)}"


def rate_window_key(base: str, window: int) -> str:
    """One fixed window of a rate key: the window's start divided by its length."""
    return f"{base}.{window}"


def rate_node_key(node: str) -> str:
    return f"node.{rate_token(node)}"


# ---- cluster agents (compute plane) ---------------------------------------------------------------

AGENT_REQUESTS = BucketSpec(
    name="nvcf_agent_requests",
    description="Instance requests each cluster agent holds, with the processes that run them (key: "
    "<clusterId>.<requestId>); finished ones linger with a TTL so a redelivered message is recognised.",
    per_key_ttl=True,
)
AGENT_REQUEST = VersionedCodec(AgentRequest, 1, "agent request")


def agent_request_key(cluster_id: str, request_id: str) -> str:
    """``<clusterId>.<requestId>`` (agent requests)."""
    return f"{cluster_id}.{request_id}"


def agent_requests_pattern(cluster_id: str) -> str:
    """Every request one cluster's agent holds."""
    return f"{cluster_id}.*"
