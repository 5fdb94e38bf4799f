"""Settings of the compute plane (``plugins.compute``) and the local backend's image catalog (``images:``)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Literal

import attrs

from nvcf_mono.contracts.egress import networks_problem, servers_problem
from nvcf_mono.contracts.telemetry import proxy_problem
from nvcf_mono.structure import ByteSize, Seconds, at_least, in_range, matches, optional, positive, setting

_NAME = matches(r"[A-Za-z0-9][A-Za-z0-9_-]*", "letters, digits, '-' or '_'")
_GPU = matches(r"[A-Za-z0-9][A-Za-z0-9-]*", "letters, digits or '-' (H100, L40S, RTXPRO6000)")
#: (uid_t)-1 means "no change" to the kernel: the largest uid a process may have is one less.
MAX_UID = 2**32 - 2
_CLUSTER_ID = matches(r"[A-Za-z0-9][A-Za-z0-9_-]*", "letters, digits, '-' or '_' (it is a NATS subject token)")


@attrs.frozen(kw_only=True)
class GpuSettings:
    """GPUs of a cluster without real ones to discover (a fake GPU operator for dev boxes and CI)."""

    name: str = setting("H100", doc="GPU model as NVCF names it (H100, A100, L40S).", check=_GPU)
    count: int = setting(8, doc="GPUs per node.", check=in_range(1, 64))
    nodes: int = setting(1, doc="Nodes with `count` GPUs each.", check=in_range(1, 1024))
    memory: str = setting("80GB", doc="Memory of one GPU (the instance types' gpuMemory).")
    product: str | None = setting(None, doc="Full product name, e.g. NVIDIA-H100-80GB-HBM3 (descriptions).")


@attrs.frozen(kw_only=True)
class Toleration:
    """A toleration every instance pod of the cluster gets (besides nvidia.com/gpu)."""

    key: str = setting("", doc="Taint key; empty with operator Exists tolerates every taint.")
    operator: Literal["Exists", "Equal"] = setting("Exists", doc="Exists or Equal.")
    value: str | None = setting(None, doc="Taint value (operator Equal).")
    effect: Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"] = setting("", doc="Empty: every effect.")


@attrs.frozen(kw_only=True)
class KubernetesSettings:
    """A cluster whose instances run as pods (``backend: kubernetes``; reference compute-plane §3, §4, §6)."""

    kubeconfig: Path | None = setting(
        None,
        doc="Kubeconfig of the GPU cluster. Unset: the service account of the pod the agent runs in (in-cluster).",
    )
    context: str | None = setting(None, doc="Context of the kubeconfig. Default: its current context.")
    namespace: str = setting(
        "nvcf-backend",
        doc="Namespace of instance pods, their secrets and ICMSRequest objects (created if missing).",
        check=matches(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", "a DNS label"),
    )
    worker_image: str = setting(
        "nvcf-mono:latest",
        doc="Image of every pod's `utils` container: this project's image, running `nvcf-mono worker`.",
    )
    worker_pull_policy: Literal["Always", "IfNotPresent", "Never"] = setting(
        "IfNotPresent", doc="imagePullPolicy of the utils container."
    )
    image_pull_secrets: tuple[str, ...] = setting(
        (), doc="Secrets in `namespace` every pod may pull with (besides the account's registry credentials)."
    )
    tolerations: tuple[Toleration, ...] = setting((), doc="Tolerations every instance pod gets.")
    priority_class_name: str | None = setting(None, doc="priorityClassName of instance pods.")
    scheduler_name: str | None = setting(None, doc="schedulerName of instance pods (e.g. a gang scheduler).")
    termination_grace: Seconds = setting(
        120.0,
        doc="terminationGracePeriodSeconds of function pods (tasks: max(1h, the task's grace)).",
        check=at_least(0),
    )
    scheduling_timeout: Seconds = setting(
        600.0,
        doc="A pod unschedulable this long is instance-terminated-no-capacity (tasks: maxQueuedDuration).",
        check=positive,
    )
    image_pull_timeout: Seconds = setting(
        60.0, doc="A pod failing to pull its image this long is image-pull-issues.", check=positive
    )
    init_timeout: Seconds = setting(
        7200.0, doc="A pod not initialized this long is init-container-stuck.", check=positive
    )
    pending_timeout: Seconds = setting(
        3 * 3600.0,
        doc="A Helm instance whose objects are not all ready this long (since it last was) fails "
        "(ObjectsTimedOutPending).",
        check=positive,
    )
    failing_object_backoff: Seconds = setting(
        90.0,
        doc="A Helm instance's object with a transient failure (FailedMount, FailedAttachVolume) still failing "
        "after this long fails the instance.",
        check=positive,
    )
    stop_instances_on_shutdown: bool = setting(
        False,
        doc="Delete the cluster's pods when the agent stops. false (NVCA's way): pods outlive an agent restart or "
        "upgrade, and the next agent takes them over.",
    )
    allow_local_charts: bool = setting(
        False, doc="Development: Helm functions may name a chart by file:// URL or path on the agent's machine."
    )
    label_nodes: bool = setting(
        True, doc="Label GPU nodes nvca.nvcf.nvidia.io/instance-type=<PROVIDER>.GPU.<GPU> (pods require it)."
    )
    multi_node: bool = setting(True, doc="Register multi-node instance types <type>_<g>x.x<nodes> as well.")
    secrets_refresh: Seconds = setting(
        30.0,
        doc="How often the agent fetches each instance's secrets again and updates its Secret when they changed "
        "(the kubelet then replaces the mounted file, within its sync period); also how often the instance's "
        "worker, and the agent sending its output, ask for its telemetry endpoints' secrets; 0: never.",
        check=at_least(0),
    )
    nvcf_backend: bool = setting(
        True,
        doc="Take the cluster's attributes, GPU discovery and feature gates from its NVCFBackend object when "
        "there is one (and report the agent's status in it).",
    )
    nvcf_backend_namespace: str = setting("nvca-operator", doc="Where the cluster's NVCFBackend object is.")
    nvcf_backend_name: str | None = setting(
        None, doc="Its name. Default: the only NVCFBackend in nvcf_backend_namespace."
    )
    api_timeout: Seconds = setting(10.0, doc="Deadline of one call to the Kubernetes API.", check=positive)
    watch_timeout: Seconds = setting(
        240.0, doc="A watch is restarted after this long (with a fresh list), as client-go does.", check=positive
    )
    error_log_bytes: ByteSize = setting(
        1024, doc="How much of a failed pod's log and events a failure report carries.", check=in_range(64, 64 * 1024)
    )


@attrs.frozen(kw_only=True)
class ContainerSettings:
    """A cluster whose instances run as containers on Podman or Docker (``backend: containers``)."""

    engine: Literal["auto", "podman", "docker"] = setting(
        "auto", doc="The container engine behind the socket; auto: whatever answers there (its /version says)."
    )
    socket: str | None = setting(
        None,
        doc="The engine's API socket (a path or unix:// URL). Default: $DOCKER_HOST when it is unix://, then "
        "/run/podman/podman.sock, /var/run/docker.sock, $XDG_RUNTIME_DIR/podman/podman.sock; where none answers "
        "and `podman` is installed, the backend runs `podman system service` on a socket of its own.",
    )
    start_podman: bool = setting(
        True, doc="Run `podman system service` for the backend's lifetime when no engine socket answers."
    )
    pull_policy: Literal["Always", "IfNotPresent", "Never"] = setting(
        "IfNotPresent", doc="When images are pulled: as Kubernetes' imagePullPolicy."
    )
    pull_timeout: Seconds = setting(
        600.0, doc="A pull that has not finished this long is image-pull-issues.", check=positive
    )
    image_pulls: Literal["platform", "engine"] = setting(
        "platform",
        doc="Who reads a function's image from its registry. platform: this process, over https, reaching the "
        "registry (its token service and blob storage too) only at public addresses and in registry_networks, "
        "checking every blob's digest, then loads it into the engine (on Podman without the layers the host has "
        "in images the account may start); a tenant's image name cannot make the host connect anywhere else. "
        "engine: the engine pulls it itself, with its own registries.conf (mirrors, plain-http registries) and "
        "no address checks: for hosts whose tenants are trusted.",
    )
    registry_networks: tuple[str, ...] = setting(
        (),
        doc="Non-public networks (CIDR) where image_pulls: platform reaches registries, e.g. [10.20.0.0/16] for a "
        "registry on the operator's network; names are checked as they resolve, redirects too.",
        check=networks_problem,
    )
    plain_http_registries: tuple[str, ...] = setting(
        (),
        doc="Registries (host or host:port, as image names give them) image_pulls: platform reads over plain http, "
        "e.g. [registry.lab:5000] for one on the operator's network without TLS; their addresses must still be "
        "public or in registry_networks, and the account's credentials go to them unencrypted.",
        check=servers_problem,
    )
    registry_ca_file: Path | None = setting(
        None, doc="A CA bundle trusted, besides the system's, for registries (image_pulls: platform)."
    )
    max_image_size: ByteSize = setting(
        100 * 1024**3,
        doc="Largest image (its layers, compressed, and its config) image_pulls: platform reads; the pull writes "
        "what it reads to the instance's directory before the engine loads it.",
        check=at_least(1024**2),
    )
    network: str | None = setting(None, doc="The network instance containers join. Default: the engine's.")
    shm_size: ByteSize = setting(
        1024**3, doc="Size of each instance's /dev/shm (NVCF mounts a memory-backed one).", check=at_least(1024**2)
    )
    limit_resources: bool = setting(True, doc="Limit each container to its instance type's CPU cores and memory.")
    gpus: Literal["auto", "cdi", "none"] = setting(
        "auto",
        doc="How containers get their GPUs: cdi (nvidia.com/gpu=<index>, the NVIDIA container toolkit's CDI "
        "devices); none (pretend GPUs: CUDA_VISIBLE_DEVICES only); auto: cdi where /etc/cdi or /var/run/cdi "
        "names nvidia.com/gpu devices.",
    )
    api_timeout: Seconds = setting(
        30.0, doc="Deadline of one call to the engine (pulls: pull_timeout).", check=positive
    )
    stop_instances_on_shutdown: bool = setting(
        True,
        doc="Stop every instance when the host stops. false: leave its containers and worker running; the next "
        "start takes them over.",
    )


@attrs.frozen(kw_only=True)
class ClusterSettings:
    """One cluster this process runs an agent for."""

    name: str = setting("local", doc="Cluster name (NVCF's availability zone); unique in this process.", check=_NAME)
    id: str | None = setting(
        None,
        doc="Cluster id. Default: generated at first start and kept in the plugin's state directory.",
        check=optional(_CLUSTER_ID),
    )
    group: str | None = setting(
        None, doc="Cluster group: the `backend` deployments name. Default: the cluster name.", check=optional(_NAME)
    )
    region: str | None = setting(None, doc="Region of the cluster. Default: node.region.")
    cloud_provider: str = setting(
        "ON-PREM",
        doc="Provider part of instance-type names: ON-PREM, DGX-CLOUD, AWS, GCP, OCI, AZURE, NCP.",
        check=matches(r"[A-Z0-9-]+", "upper-case letters, digits or '-'"),
    )
    backend: str = setting(
        "local",
        doc="The compute backend that runs its instances: local (built in: processes on this machine, "
        "container functions only), containers (images on Podman or Docker), kubernetes, or one a plugin provides.",
        check=matches(r"[a-z][a-z0-9_-]*", "a backend name: lower-case letters, digits, '_' or '-'"),
    )
    gpu_discovery: Literal["auto", "nvidia-smi", "static"] = setting(
        "auto",
        doc="auto: the GPUs nvidia-smi lists when it is present, else `gpus`; nvidia-smi: only real GPUs; "
        "static: always `gpus`.",
    )
    gpus: tuple[GpuSettings, ...] = setting(
        factory=lambda: (GpuSettings(),), doc="The GPU inventory registered when no real GPUs are discovered."
    )
    attributes: tuple[str, ...] = setting((), doc="Attributes deployments may require, e.g. [NVLinkOptimized=true].")
    kubernetes: KubernetesSettings = setting(
        factory=KubernetesSettings, doc="The Kubernetes backend (clusters with backend: kubernetes)."
    )
    containers: ContainerSettings = setting(
        factory=ContainerSettings, doc="The container backend (clusters with backend: containers)."
    )
    nca_id: str | None = setting(None, doc="The account that owns the cluster. Default: shared with every account.")
    authorized_nca_ids: tuple[str, ...] = setting((), doc="Further accounts that may deploy on an owned cluster.")


@attrs.frozen(kw_only=True)
class HealthSettings:
    """When an instance counts as failed (reference compute-plane §4; NVCA's defaults)."""

    start_timeout: Seconds = setting(
        7200.0, doc="An instance never ready this long after launch is degraded-worker.", check=positive
    )
    degradation_period: Seconds = setting(
        1800.0, doc="An instance that was ready and has not been for this long is degraded-worker.", check=positive
    )
    restart_limit: int = setting(
        3, doc="This many process exits within restart_window is container-restart-loop.", check=in_range(1, 100)
    )
    restart_window: Seconds = setting(600.0, doc="Window over which exits are counted.", check=positive)
    restart_backoff: Seconds = setting(
        1.0, doc="Pause before a process that exited is started again (doubles each time).", check=positive
    )
    restart_backoff_max: Seconds = setting(30.0, doc="Longest pause before a restart.", check=positive)
    probe_interval: Seconds = setting(
        1.0, doc="How often each instance's processes and readiness are checked.", check=at_least(0.05)
    )
    probe_timeout: Seconds = setting(2.0, doc="Deadline of one readiness check.", check=positive)


@attrs.frozen(kw_only=True)
class LocalSettings:
    """The local backend: instances are processes on this machine."""

    termination_grace: Seconds = setting(
        30.0, doc="Between SIGTERM and SIGKILL when an instance stops (its worker drains meanwhile).", check=at_least(0)
    )
    stop_instances_on_shutdown: bool = setting(
        True,
        doc="Stop every instance when the host stops. false: leave them running; the next start re-adopts them.",
    )
    worker_command: tuple[str, ...] = setting(
        (), doc="The sidecar's command line. Default: this Python running `nvcf_mono worker`."
    )
    secrets_refresh: Seconds = setting(
        10.0,
        doc="How often an instance's worker fetches the function's secrets again and rewrites its secrets file "
        "(atomically) when they changed, so an update reaches running instances within this time; a telemetry "
        "endpoint's new secret too, in the worker's exports and the agent's sending of its output (0: never).",
        check=at_least(0),
    )
    secrets_timeout: Seconds = setting(
        60.0,
        doc="How long the worker may take to fetch an instance's secrets before its server starts "
        "(for a task: to connect before the task starts).",
        check=positive,
    )
    error_log_bytes: ByteSize = setting(
        1024, doc="How much of an instance's log a failure report carries.", check=in_range(64, 64 * 1024)
    )
    task_flush_timeout: Seconds = setting(
        30.0,
        doc="Tasks: once the task's process ended, how long its worker may take to upload the last results.",
        check=positive,
    )
    run_as: Literal["auto", "instance-users", "platform-user"] = setting(
        "auto",
        doc="Who runs instance processes. instance-users (needs root): each instance's server and worker run as "
        "two users of their own from first_uid/uid_count, so a function cannot read the state directory, other "
        "instances or its worker's token. platform-user: nvcf-mono's own user, which every function can then act "
        "as (trusted functions only; a warning at start says so). auto: instance-users when nvcf-mono runs as "
        "root, else platform-user.",
    )
    first_uid: int = setting(
        1879048192,
        doc="Instance users: the first uid (and gid) of their range; uids need no /etc/passwd entry. The first is "
        "the group every instance process is in, then each instance takes two (the first also its group). The "
        "default, 0x70000000, lies past systemd-nspawn's container range; keep the range free of real users.",
        check=in_range(1000, 4_000_000_000),
    )
    uid_count: int = setting(
        65536,
        doc="Instance users: how many uids the range holds ((uid_count - 1) / 2 instances at once). A uid is "
        "reused as late as the range allows.",
        check=in_range(3, 1 << 24),
    )
    extra_gids: tuple[int, ...] = setting(
        (),
        doc="Instance users: further groups their processes belong to, e.g. the group owning /dev/nvidia* where "
        "the driver does not let every user open the GPUs (NVreg_DeviceFileMode other than 0666).",
    )
    lease_dir: Path = setting(
        Path("/run/nvcf-mono/instance-users"),
        doc="Instance users: where each nvcf-mono on this host claims the uids it gives an instance (a lock file "
        "per uid, released with the process that held it), so two agents or platforms on one host never give "
        "the same users to two instances. Every nvcf-mono of the host must name the same directory.",
    )
    grant_search: bool = setting(
        True,
        doc="Instance users: give their shared group search permission (x, never read) on the directories "
        "leading to this Python, its packages and the instance directories (a POSIX ACL entry, or o+x where "
        "the filesystem has none), logging each change. false: arrange it yourself; a launch that cannot reach "
        "them fails naming the directory.",
    )

    def __checks__(self) -> Iterator[tuple[str, str]]:
        if self.first_uid + self.uid_count > MAX_UID:
            yield "uid_count", f"first_uid + uid_count must not pass {MAX_UID} (the largest uid)"


def stops_instances_on_shutdown(cluster: ClusterSettings, local: LocalSettings) -> bool:
    """Whether the agent of ``cluster`` stops its instances when the host stops."""
    if cluster.backend == "kubernetes":
        return cluster.kubernetes.stop_instances_on_shutdown
    if cluster.backend == "containers":
        return cluster.containers.stop_instances_on_shutdown
    return local.stop_instances_on_shutdown


@attrs.frozen(kw_only=True)
class ComputeConfig:
    """Settings of the compute plane: the cluster agents this process runs, and how."""

    clusters: tuple[ClusterSettings, ...] = setting(
        factory=lambda: (ClusterSettings(),),
        doc="Clusters to run an agent for (one process may host several). Default: one local cluster.",
    )
    heartbeat_interval: Seconds = setting(5.0, doc="Between heartbeats to the control plane.", check=positive)
    inventory_interval: Seconds = setting(
        60.0, doc="How often GPUs are discovered again (a change registers the cluster again).", check=positive
    )
    reregister_interval: Seconds = setting(3600.0, doc="Register again at least this often.", check=positive)
    status_interval: Seconds = setting(
        300.0, doc="Every live instance's status is reported at least this often.", check=positive
    )
    sync_interval: Seconds = setting(
        300.0,
        doc="How often the agent compares its instances with the control plane's list and stops unwanted ones.",
        check=positive,
    )
    sync_grace: Seconds = setting(
        30.0, doc="Instances younger than this are never stopped by that comparison.", check=at_least(0)
    )
    call_timeout: Seconds = setting(5.0, doc="Deadline of one call to the control plane.", check=positive)
    retry_backoff_max: Seconds = setting(5.0, doc="Longest pause between retries of a failed call.", check=positive)
    max_inflight: int = setting(10, doc="Creation (and termination) messages handled at once.", check=in_range(1, 1000))
    fetch_timeout: Seconds = setting(3.0, doc="How long one pull from a durable waits for messages.", check=positive)
    capacity_backoff: Seconds = setting(
        5.0, doc="A creation message that does not fit the free GPUs is redelivered after this.", check=positive
    )
    finished_ttl: Seconds = setting(
        3600.0,
        doc="How long a finished request is remembered (its logs kept, its redeliveries recognised).",
        check=positive,
    )
    health: HealthSettings = setting(factory=HealthSettings, doc="Instance health timeouts.")
    local: LocalSettings = setting(factory=LocalSettings, doc="The local backend.")
    telemetry_proxy: str | None = setting(
        None,
        doc="An HTTP proxy (http://host:port) this node's agents and the workers they start reach a function's "
        "or task's telemetry endpoints through, where the network has no direct way out. An address in the "
        "endpoint's URL, or what its name resolves to here, is still checked against "
        "plugins.control.telemetry_networks; the proxy resolves the name itself and its own rules apply. "
        "Unset: endpoints are reached directly (environment proxy variables are never used for them).",
        check=optional(proxy_problem),
    )

    def __checks__(self) -> Iterator[tuple[str, str]]:
        # Items that failed their own checks are reported already (and are not settings objects).
        clusters = [c for c in self.clusters if _valid(c, ClusterSettings)]
        names = [c.name for c in clusters]
        for name in sorted({n for n in names if names.count(n) > 1}):
            yield "clusters", f"cluster name {name!r} is used twice"
        ids = [c.id for c in clusters if c.id is not None]
        for cid in sorted({i for i in ids if ids.count(i) > 1}):
            yield "clusters", f"cluster id {cid!r} is used twice"
        for i, cluster in enumerate(self.clusters):
            if not _valid(cluster, ClusterSettings):
                continue
            gpu_names = [g.name.upper() for g in cluster.gpus if _valid(g, GpuSettings)]
            for name in sorted({n for n in gpu_names if gpu_names.count(n) > 1}):
                yield f"clusters.{i}.gpus", f"GPU {name} is listed twice"


def _valid(item: object, tp: type) -> bool:
    """``item`` is a ``tp`` (not the marker of an item whose own checks failed)."""
    return isinstance(item, tp)


@attrs.frozen(kw_only=True)
class Image:
    """How the local backend runs one container image: a command line on this machine."""

    command: tuple[str, ...] = setting(
        (),
        doc="Command line of the image's server; the function's containerArgs follow it as written. {port}: the "
        "instance's port; {python}: this Python; {instance_dir}: the instance's directory (filled here, in cwd and "
        "in env, never in containerArgs).",
    )
    cwd: Path | None = setting(None, doc="Working directory. Default: the instance's directory.")
    env: Mapping[str, str] = setting(factory=dict, doc="Environment of the server (placeholders as in command).")
    port: int | None = setting(
        None,
        doc="The port the server always listens on, for a command that cannot be told ({port}, INFERENCE_PORT or "
        "PORT): such an image runs one instance per host.",
        check=optional(in_range(1, 65535)),
    )
    description: str = setting("", doc="What the image is.")


#: The images every installation knows: the example functions of ``nvcf_mono.examples``.
BUILTIN_IMAGES: Mapping[str, Image] = {
    "echo": Image(
        command=("{python}", "-m", "nvcf_mono.examples.echo", "--port", "{port}"),
        description="HTTP echo (nvcf_mono.examples.echo): POST /echo answers {message, repeats, delay, stream} "
        "like NVIDIA's sample.",
    ),
    "sse": Image(
        command=("{python}", "-m", "nvcf_mono.examples.sse", "--port", "{port}"),
        description="Server-sent events (nvcf_mono.examples.sse): POST /stream streams {text} word by word.",
    ),
    "llm": Image(
        command=("{python}", "-m", "nvcf_mono.examples.llm", "--port", "{port}"),
        description="A tiny OpenAI-compatible model (nvcf_mono.examples.llm): chat, completions, embeddings, "
        "responses; call it through /v1.",
    ),
    "grpc-echo": Image(
        command=("{python}", "-m", "nvcf_mono.examples.grpc_echo", "--port", "{port}"),
        description="gRPC echo (nvcf_mono.examples.grpc_echo): examples.echo.v1.EchoService, inferenceUrl /grpc.",
    ),
    "task-example": Image(
        command=("{python}", "-m", "nvcf_mono.examples.task"),
        description="A task (nvcf_mono.examples.task): counts --steps in --seconds with progress, writes squares.json.",
    ),
}


def image_catalog(configured: Mapping[str, Image] | None) -> dict[str, Image]:
    """The built-in images, then the configured ones (which win)."""
    return {**BUILTIN_IMAGES, **(configured or {})}
