"""Clusters as their agents register them, heartbeats, and instance-type naming."""

from __future__ import annotations

import enum
import re

import attrs

from nvcf_mono.structure import WireModel, wire

_INSTANCE_TYPE_RX = re.compile(
    r"(?i)^(?P<csp>[A-Z0-9-]+)\.GPU\.(?P<gpu>[A-Z0-9_-]+?)_(?P<n>\d+)x(?:\.x(?P<nodes>\d+))?$"
)


class CloudProvider(enum.Enum):
    """``cloudProvider`` of a cluster."""

    ON_PREM = "ON-PREM"
    DGX_CLOUD = "DGX-CLOUD"
    AWS = "AWS"
    OCI = "OCI"
    AZURE = "AZURE"
    GDN = "GDN"
    GFN = "GFN"
    GCP = "GCP"
    NCP = "NCP"


@attrs.frozen
class InstanceTypeName:
    """The parts of ``<CSP>.GPU.<GPU>_<n>x[.x<nodes>]``."""

    provider: str
    gpu: str
    gpus_per_node: int
    nodes: int

    @property
    def value(self) -> str:
        """``<CSP>.GPU.<GPU>`` (the node label value)."""
        return f"{self.provider}.GPU.{self.gpu}"

    @property
    def gpu_count(self) -> int:
        """GPUs one instance occupies."""
        return self.gpus_per_node * self.nodes

    def __str__(self) -> str:
        suffix = f".x{self.nodes}" if self.nodes > 1 else ""
        return f"{self.value}_{self.gpus_per_node}x{suffix}"


def parse_instance_type(name: str) -> InstanceTypeName | None:
    """Parse an instance type name (case-insensitive); None when it is not of that shape."""
    m = _INSTANCE_TYPE_RX.match(name.strip())
    if m is None:
        return None
    return InstanceTypeName(
        provider=m["csp"].upper(), gpu=m["gpu"].upper(), gpus_per_node=int(m["n"]), nodes=int(m["nodes"] or 1)
    )


def instance_type_name(provider: str, gpu: str, gpus: int, nodes: int = 1) -> str:
    """``instance_type_name("ON-PREM", "H100", 2)`` -> ``ON-PREM.GPU.H100_2x``."""
    return str(InstanceTypeName(provider=provider.upper(), gpu=gpu.upper(), gpus_per_node=gpus, nodes=nodes))


@wire
class InstanceType(WireModel):
    """One instance type of a GPU on a cluster, with what fits."""

    name: str
    value: str
    gpu_count: int
    max_instances: int
    description: str = ""
    default: bool = False
    nodes: int = 1
    #: Instances that would fit on nodes that cannot take pods now (not Ready, cordoned).
    unschedulable_capacity: int | None = None
    cpu_cores: int | None = None
    system_memory: str | None = None
    gpu_memory: str | None = None
    cpu_arch: str | None = None
    os: str | None = None
    driver_version: str | None = None
    storage: str | None = None


@wire
class ClusterGpu(WireModel):
    """A GPU model on a cluster: how many, and the instance types it offers."""

    name: str
    capacity: int
    instance_types: tuple[InstanceType, ...]


class ClusterStatus(enum.Enum):
    """What the agent says of its cluster when it registers."""

    READY = "READY"
    CORDON = "CORDON"
    CORDON_AND_DRAIN = "CORDON_AND_DRAIN"


@wire
class Cluster(WireModel):
    """A registered cluster (bucket ``nvcf_clusters``)."""

    cluster_id: str
    cluster_name: str
    cluster_group_name: str
    cluster_group_id: str
    nca_id: str
    region: str
    cloud_provider: str
    gpus: tuple[ClusterGpu, ...]
    registered_at: str
    status: ClusterStatus = ClusterStatus.READY
    authorized_nca_ids: tuple[str, ...] = ()
    attributes: tuple[str, ...] = ()
    capabilities: tuple[str, ...] = ()
    nvca_version: str = "0.0.0"
    k8s_version: str | None = None
    #: "agent" when an agent registered it, "api" when registered over REST and no agent has yet.
    source: str = "agent"
    last_registered_at: str | None = None

    def gpu(self, name: str) -> ClusterGpu | None:
        """The GPU named ``name`` (case-insensitive)."""
        for gpu in self.gpus:
            if gpu.name.upper() == name.upper():
                return gpu
        return None

    def instance_type(self, gpu: str, name: str) -> InstanceType | None:
        """The instance type ``name`` of GPU ``gpu`` (case-insensitive)."""
        found = self.gpu(gpu)
        if found is None:
            return None
        for it in found.instance_types:
            if it.name.upper() == name.upper():
                return it
        return None

    def has_attributes(self, wanted: tuple[str, ...]) -> bool:
        """Every wanted attribute (``NVLinkOptimized`` or ``NVLinkOptimized=true``) is set."""
        have = {a.split("=", 1)[0].lower(): a for a in self.attributes}
        for attr in wanted:
            name, _, value = attr.partition("=")
            got = have.get(name.lower())
            if got is None:
                return False
            if value and got.partition("=")[2].lower() not in (value.lower(), ""):
                return False
        return True


@wire
class GpuUsage(WireModel):
    """Heartbeat usage of one GPU model (in GPUs)."""

    capacity: int
    available: int
    allocated: int


class MaintenanceMode(enum.Enum):
    """Whether the cluster takes new work."""

    NONE = "None"
    CORDON_ONLY = "CordonOnly"
    CORDON_AND_DRAIN = "CordonAndDrain"


@wire
class ClusterHeartbeat(WireModel):
    """The last heartbeat of a cluster (bucket ``nvcf_cluster_health``, expires after the TTL)."""

    cluster_id: str
    status: str
    at: str
    gpu_usage: dict[str, GpuUsage] = attrs.field(factory=dict)
    maintenance_mode: MaintenanceMode = MaintenanceMode.NONE
    nvca_version: str | None = None

    @property
    def healthy(self) -> bool:
        return self.status.lower() == "healthy" and self.maintenance_mode is MaintenanceMode.NONE
