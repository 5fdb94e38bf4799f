"""What runs instances for a cluster agent (NVCA's compute backend): the agent decides, a backend does.

A backend starts an instance's processes (or pods), keeps them running like a Pod with
``restartPolicy: Always`` (exits are counted, not judged), observes readiness, and stops them.
The agent turns observations into states and reports (``planes/compute/health.py``).

Backends are plugins: a plugin contributes a :class:`BackendProvider` to :data:`COMPUTE_BACKENDS`
in its ``setup()``, and a cluster whose ``backend:`` names it runs its instances there. The
compute plane contributes ``local`` itself.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Protocol

import attrs

from nvcf_mono.contracts.agent import AgentInstance, AgentLog, AgentProcess
from nvcf_mono.contracts.messages import CreationMessage
from nvcf_mono.helm import ChartRenderer
from nvcf_mono.miniservice_extensions import MiniServiceExtension
from nvcf_mono.planes.compute.config import ComputeConfig, Image
from nvcf_mono.planes.compute.gpus import Allocation, Inventory
from nvcf_mono.planes.compute.health import LaunchFailure, Observation
from nvcf_mono.services import ExtensionPoint


@attrs.define
class WorkerEndpoint:
    """Where instances dial the WorkerService now, as the control plane last said (None before it has).

    The creation message names the address of its day; a platform that came back on other ports
    says the new one in its registration and heartbeat answers, and backends pass it on to
    running instances (the local backend rewrites their address file).
    """

    address: str | None = None


@attrs.frozen(kw_only=True)
class LaunchSpec:
    """One instance to start (or to take over after the agent restarted)."""

    cluster_id: str
    request_id: str
    instance_id: str
    message: CreationMessage
    allocation: Allocation | None
    directory: Path
    #: The instance type's CPU cores and memory (``<n>G``), for backends that set limits (None: unknown).
    cpus: int | None = None
    memory: str | None = None


class InstanceHandle(Protocol):
    """A started instance, as the backend tracks it."""

    @property
    def instance_id(self) -> str: ...

    @property
    def port(self) -> int | None:
        """Where its inference server listens (this host)."""
        ...

    @property
    def health_port(self) -> int | None:
        """Where its worker's ``/v1/health`` endpoints listen."""
        ...

    @property
    def processes(self) -> tuple[AgentProcess, ...]:
        """Its processes now (stored, so a restarted agent can take them over)."""
        ...


class Backend(Protocol):
    """Runs instances on some substrate (processes on this machine, pods, ...).

    Entered (``async with``) before the agents start and left after they stopped.
    """

    name: str

    @property
    def capabilities(self) -> tuple[str, ...]:
        """Registered with the cluster (``HelmMiniService``: the control plane may send Helm functions)."""
        ...

    async def discover(self, cluster_id: str) -> Inventory | None:
        """The cluster's GPUs as this backend sees them (a Kubernetes cluster's nodes); None: the agent's own
        discovery (``nvidia-smi`` or the configured inventory).
        """
        ...

    def cluster_facts(self, cluster_id: str) -> ClusterFacts:
        """What the cluster says about itself, for its registration (as of the last ``discover``)."""
        ...

    def refuse(self, message: CreationMessage) -> LaunchFailure | None:
        """A workload this backend cannot run at all (a Helm chart on the local backend)."""
        ...

    async def start(self, spec: LaunchSpec) -> InstanceHandle:
        """Start an instance; launch failures show in its first observation."""
        ...

    async def adopt(self, spec: LaunchSpec, recorded: AgentInstance) -> InstanceHandle:
        """Take over an instance started before the agent restarted; what is gone is started again."""
        ...

    async def observe(self, handle: InstanceHandle) -> Observation:
        """Look at the instance now (and start again what exited, after a backoff)."""
        ...

    async def stop(self, handle: InstanceHandle, grace: float) -> None:
        """Stop it: ask, wait up to ``grace`` seconds, then force. Safe to call twice."""
        ...

    async def release(self, handle: InstanceHandle) -> None:
        """Forget it (after stop): free its ports, remove what should not outlive it."""
        ...

    async def logs(self, cluster_id: str, instance: AgentInstance, tail: int) -> tuple[AgentLog, ...]:
        """The ends of an instance's logs (``tail`` bytes each)."""
        ...

    def error_log(self, handle: InstanceHandle, source: str, limit: int) -> str:
        """The last ``limit`` bytes of the log that explains a failure (``source``: k8s, utils, init)."""
        ...

    async def sweep(self, cluster_id: str, root: Path, keep: Sequence[AgentInstance]) -> list[str]:
        """Stop what runs for this cluster that no record holds (``keep``: the recorded live instances);
        the instance ids stopped.
        """
        ...

    async def __aenter__(self) -> object: ...

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...


@attrs.frozen(kw_only=True)
class ClusterFacts:
    """What a backend learned of a cluster beyond its GPUs (a Kubernetes cluster's NVCFBackend object)."""

    #: None: not a Kubernetes cluster.
    kubernetes_version: str | None = None
    #: The cluster's attributes (None: the configured ones).
    attributes: tuple[str, ...] | None = None
    #: What it registers (None: the backend's ``capabilities``).
    capabilities: tuple[str, ...] | None = None


@attrs.frozen(kw_only=True)
class BackendContext:
    """What a backend is made from: the plane's settings, the image catalog, the host's environment."""

    config: ComputeConfig
    catalog: Mapping[str, Image]
    environ: Mapping[str, str]
    state_dir: Path
    log: logging.Logger
    #: Cluster name -> cluster id, for every configured cluster.
    cluster_ids: Mapping[str, str] = attrs.field(factory=dict)
    #: Renders Helm charts (the ``helm`` plugin's ``CHART_RENDERER``); None where that plugin is off.
    charts: ChartRenderer | None = None
    #: The WorkerService address now, kept current by the cluster agents.
    endpoint: WorkerEndpoint = attrs.field(factory=WorkerEndpoint)
    #: What plugins add to Helm installs (the Kubernetes backend's MiniServices).
    miniservice_extensions: tuple[MiniServiceExtension, ...] = ()


class BackendProvider(Protocol):
    """Makes the backend named ``name`` (one per compute plugin, shared by its clusters that name it)."""

    name: str

    def create(self, ctx: BackendContext) -> Backend: ...


#: Compute backends by name: the ``backend:`` of a cluster in ``plugins.compute.clusters``.
COMPUTE_BACKENDS: ExtensionPoint[BackendProvider] = ExtensionPoint("nvcf_mono.compute.backends")
