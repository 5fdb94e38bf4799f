"""Settings of the control plane (``plugins.control``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import attrs

from nvcf_mono.contracts.egress import networks_problem
from nvcf_mono.models.account import DEFAULT_ACCOUNT
from nvcf_mono.structure import Seconds, at_least, in_range, matches, optional, positive, setting


@attrs.frozen(kw_only=True)
class ReconcileSettings:
    """The deployment reconciler (one leader at a time across control-plane processes)."""

    lease_ttl: Seconds = setting(10.0, doc="A leader that stops renewing is replaced after this.", check=positive)
    interval: Seconds = setting(
        2.0, doc="Reconcile at least this often (changes on the bus trigger it at once).", check=positive
    )
    ack_timeout: Seconds = setting(
        120.0,
        doc="An instance request no agent acknowledged after this is given up and placed again.",
        check=positive,
    )
    start_timeout: Seconds = setting(
        7200.0, doc="An acknowledged instance not running after this is terminated and replaced.", check=positive
    )
    terminate_timeout: Seconds = setting(
        300.0, doc="A terminating instance whose agent never confirms is forgotten after this.", check=positive
    )
    deploy_failure_limit: int = setting(
        3,
        doc="While DEPLOYING, this many failed instances with none running puts the version in ERROR.",
        check=at_least(1),
    )
    lost_after: Seconds = setting(
        120.0,
        doc="An instance whose cluster has sent no heartbeat for this long, and whose worker no invocation node "
        "reports, is lost with its cluster: forgotten (the agent stops it if it comes back) and replaced where "
        "the deployment may run.",
        check=positive,
    )
    retry_backoff: Seconds = setting(2.0, doc="First pause before replacing a failed instance.", check=positive)
    retry_backoff_max: Seconds = setting(300.0, doc="Longest pause between replacements.", check=positive)
    failures_kept: int = setting(10, doc="Recent failures kept per spec for healthInfo.", check=in_range(1, 100))
    rebalance: bool = setting(
        False,
        doc="Instances spill over to the next matching cluster when the preferred one is full; with this, "
        "they move back when it has room again (a new instance starts there first, then the spilled one goes).",
    )


@attrs.frozen(kw_only=True)
class AutoscalerSettings:
    """The autoscaler: NVCF's algorithm over utilization the platform measures, plus queue depth.

    It runs in the process that holds the reconciler lease. Defaults are NVCF's, except the round
    interval (15 s there): queue depth and wake-ups make a short round cheap and useful.
    """

    enabled: bool = setting(True, doc="Scale deployments between their min and max instances.")
    interval: Seconds = setting(5.0, doc="Decide at least this often (a wake decides at once).", check=positive)
    sample_step: Seconds = setting(60.0, doc="Spacing of utilization samples (NVCF: 60 s).", check=positive)
    lookback: Seconds = setting(600.0, doc="How far back utilization samples go (NVCF: 600 s).", check=positive)
    utilization_window: Seconds = setting(
        70.0, doc="Each sample is the busy share of worker slots over this window (NVCF: 70 s).", check=positive
    )
    decay_factor: float = setting(
        0.0, doc="Weight of older samples in the scale-to-zero average: exp(-decay * age).", check=in_range(0, 100)
    )
    scale_up_threshold: float = setting(
        70.0, doc="Platform policy: scale up when utilization (percent) is above this.", check=in_range(0, 1000)
    )
    scale_down_threshold: float = setting(
        30.0, doc="Platform policy: scale down when utilization is below this.", check=in_range(0, 1000)
    )
    scale_up_factor: float = setting(1.2, doc="Platform policy: multiply instances by this (ceil).", check=positive)
    scale_down_factor: float = setting(
        0.8, doc="Platform policy: multiply instances by this (floor, never below 1).", check=positive
    )
    idle_timeout: Seconds = setting(
        1800.0,
        doc="A version not invoked for this long may scale to zero (its minInstances permitting).",
        check=positive,
    )
    worker_stale: Seconds = setting(
        5.0, doc="A worker not reported by any invocation node for this long no longer counts.", check=positive
    )

    def __checks__(self) -> Iterator[tuple[str, str]]:
        if self.scale_up_threshold <= self.scale_down_threshold:
            yield "scale_down_threshold", "must be below scale_up_threshold"
        if self.scale_up_factor <= 1:
            yield "scale_up_factor", "must be above 1"
        if not 0 < self.scale_down_factor < 1:
            yield "scale_down_factor", "must be between 0 and 1"


@attrs.frozen(kw_only=True)
class TaskSettings:
    """Tasks (NVCT): how they are watched and how long finished ones are kept (reference §3.3)."""

    monitor_interval: Seconds = setting(5.0, doc="How often tasks are placed and checked.", check=positive)
    heartbeat_interval: Seconds = setting(
        30.0, doc="How often a task's worker reports (heartbeat and progress).", check=positive
    )
    heartbeat_timeout: Seconds = setting(
        240.0, doc="A RUNNING task not heard from for this long is ERRORED (NVCF: 4 min).", check=positive
    )
    launch_timeout: Seconds = setting(
        300.0,
        doc="A task whose instance was placed but whose worker never connected, or that stays LAUNCHED without "
        "a heartbeat, is ERRORED after this (NVCF: 5 min).",
        check=positive,
    )
    retention: Seconds = setting(
        7 * 86400.0,
        doc="Finished tasks, their events and results are removed after this (NVCF: 7 days).",
        check=positive,
    )
    max_account_tasks: int = setting(
        10_000,
        doc="Tasks one account may keep, finished ones included until deleted or past their retention (0: no "
        "limit). One more is refused (400).",
        check=at_least(0),
    )
    max_results: int = setting(1000, doc="Results one task may store.", check=at_least(1))
    max_result_size: int = setting(5 * 1024**3, doc="Largest single result file uploaded, in bytes.", check=positive)
    max_account_result_bytes: int = setting(
        5 * 1024**3,
        doc="The stored result content of all of one account's tasks together, in bytes (0: no limit but the "
        "store's). A result that would pass it is refused until the account deletes finished tasks.",
        check=at_least(0),
    )


@attrs.frozen(kw_only=True)
class ChartChecks:
    """Helm charts of functions and tasks: rendered and validated like NVCF's ReVal (reference helm-validation)."""

    enabled: bool = setting(
        True,
        doc="Render and validate a Helm function's chart when it is created and when it is deployed (with the "
        "deployment's configuration values). false: only the chart URL's shape is checked here.",
    )
    enforce_security_context: bool = setting(
        False,
        doc="Fail charts whose containers break the security-context rules (runAsNonRoot, capabilities, "
        "seccomp, ...). false: report them as warnings ('not enforced yet', as NVCF documents).",
    )
    allow_local_charts: bool = setting(
        False, doc="Development: helmChart may be a file:// URL or a path on this node (a directory or .tgz)."
    )
    validate_images: bool = setting(
        False,
        doc="Check that a chart's images exist in their registries (with the account's CONTAINER registry "
        "credentials) when it is created and deployed, and in /v1/validate and /v1/render unless the request's "
        "validateImages says otherwise. false, as NVCF's ReVal is deployed.",
    )
    preserve_labels: tuple[str, ...] = setting(
        ("apps.kubernetes.io/pod-index",), doc="Label keys the sanitizer keeps on rendered objects."
    )
    preserve_annotations: tuple[str, ...] = setting(
        ("dra.nvcf.nvidia.io/required-nvlink-domain-index",),
        doc="Annotation keys the sanitizer keeps on rendered objects.",
    )


@attrs.frozen(kw_only=True)
class ControlConfig:
    """Settings of the control plane."""

    default_account: str = setting(DEFAULT_ACCOUNT, doc="The account created at first start.")
    region: str | None = setting(
        None,
        doc="Region of the request streams whose queues the API reports. Default: node.region.",
        check=optional(matches(r"[A-Za-z0-9_-]+", "letters, digits, '-' or '_'")),
    )
    cluster_heartbeat_ttl: Seconds = setting(
        30.0, doc="A cluster without a heartbeat for this long is unhealthy and gets no placements.", check=positive
    )
    worker_grpc_address: str | None = setting(
        None,
        doc="host:port instances dial for the WorkerService (the invocation plane). Default: this node's gRPC "
        "address (all-in-one).",
        check=optional(matches(r"[^\s:/]+:\d+", "host:port")),
    )
    worker_grpc_tls: bool | None = setting(
        None,
        doc="Whether instances dial worker_grpc_address over TLS. Default: as this node's gRPC port does when "
        "worker_grpc_address is unset (tls.*), else false.",
    )
    worker_grpc_ca_file: Path | None = setting(
        None,
        doc="PEM certificates instances trust for that TLS (handed to them in their environment). Default: this "
        "node's tls CA when worker_grpc_address is unset, else the system's CAs.",
    )
    api_url: str | None = setting(
        None, doc="Base URL of the API in links the platform hands out (asset uploads). Default: this node's."
    )
    bootstrap_keys: bool | None = setting(
        None,
        doc="Mint a function key and a task key at first start and write them to endpoints.json. "
        "Default: only in the all-in-one role.",
    )
    console: bool = setting(
        True, doc="Serve the web console at /console (it works through the public API with the user's credential)."
    )
    example_function: bool | None = setting(
        None,
        doc="At first start, once a cluster has registered, register the echo example function and deploy it "
        "(min 0, max 2: it scales from zero) in the default account; only once, so deleting it does not bring it back. "
        "Default: only in the all-in-one role.",
    )
    bootstrap_key_lifetime: Seconds = setting(
        365 * 86400.0, doc="Lifetime of the bootstrap keys (they are re-minted when expired).", check=positive
    )
    max_key_lifetime: Seconds = setting(365 * 86400.0, doc="Longest lifetime an API key may be given.", check=positive)
    asset_link_ttl: Seconds = setting(
        34 * 60.0, doc="How long an asset upload or download link stays valid (NVCF: 34 min).", check=positive
    )
    max_asset_size: int = setting(5 * 1024**3, doc="Largest asset accepted, in bytes.", check=positive)
    max_account_assets: int = setting(
        10_000,
        doc="Assets one account may keep (0: no limit). Creating one more is refused (400) until it deletes some: "
        "each is a record every control node keeps in memory.",
        check=at_least(0),
    )
    max_account_keys: int = setting(
        1000,
        doc="API keys one account may hold that are active and not expired (0: no limit). One more is refused "
        "(400) until it revokes some or they expire.",
        check=at_least(0),
    )
    max_account_versions: int = setting(
        10_000,
        doc="Function versions one account may keep over all its functions (0: no limit; the number of functions "
        "is the account's maxFunctionsAllowed). One more is refused (400) until it deletes some.",
        check=at_least(0),
    )
    max_account_asset_bytes: int = setting(
        5 * 1024**3,
        doc="The content of all of one account's assets together, in bytes (0: no limit but the store's). "
        "An upload that would pass it is refused (413) until the account deletes assets.",
        check=at_least(0),
    )
    telemetry_networks: tuple[str, ...] = setting(
        (),
        doc="Non-public networks (CIDR) where an account's telemetry endpoints may be, e.g. [127.0.0.0/8] for "
        "a collector on the platform's host. Exports leave from the platform's side (the worker, the cluster "
        "agent), so a tenant's endpoint is reached only at public addresses and in these networks (unspecified "
        "and multicast addresses never): checked when it is registered, and again at each connection once its "
        "name is resolved.",
        check=networks_problem,
    )
    reconcile: ReconcileSettings = setting(factory=ReconcileSettings, doc="The deployment reconciler.")
    autoscaler: AutoscalerSettings = setting(factory=AutoscalerSettings, doc="The autoscaler.")
    tasks: TaskSettings = setting(factory=TaskSettings, doc="Tasks (NVCT).")
    helm: ChartChecks = setting(factory=ChartChecks, doc="Helm charts: render and validate (ReVal).")
