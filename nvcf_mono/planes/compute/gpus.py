"""GPUs of a cluster: discovery (``nvidia-smi`` or a configured fake inventory), NVCA's GPU and
instance-type naming (reference compute-plane §6), and the allocation of devices to instances.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from typing import Any, Literal

import attrs

from nvcf_mono.models.cluster import ClusterGpu, GpuUsage, InstanceType, instance_type_name
from nvcf_mono.planes.compute.config import GpuSettings

Source = Literal["nvidia-smi", "static", "kubernetes"]

_DROPPED = {"NVIDIA", "GEFORCE", "TESLA", "QUADRO"}
_MEMORY_RX = re.compile(r"^\d+(?:\.\d+)?(?:GB|G|GIB|MB|TB)$")


def gpu_model_name(product: str) -> str:
    """NVCA's ``ParseGPUName``: ``NVIDIA-H100-80GB-HBM3`` -> ``H100``, ``NVIDIA RTX PRO 6000 ...`` -> ``RTXPRO6000``."""
    tokens = [t for t in re.split(r"[\s_-]+", product.upper()) if t and t not in _DROPPED]
    if not tokens:
        return product.strip().upper() or "GPU"
    if tokens[0] in ("RTX", "GTX"):
        # RTX names run on to the first token with a digit: RTX 4090, RTX A6000, RTX PRO 6000.
        joined = []
        for token in tokens:
            joined.append(token)
            if any(ch.isdigit() for ch in token):
                break
        return "".join(joined)
    first = tokens[0]
    return first if not _MEMORY_RX.match(first) else (tokens[1] if len(tokens) > 1 else first)


@attrs.frozen(kw_only=True)
class NodeResources:
    """What a node can give its pods (Kubernetes ``allocatable``), shared by its GPUs."""

    cpu_cores: float
    memory: int
    storage: int | None = None
    cpu_arch: str | None = None
    os: str | None = None


@attrs.frozen(kw_only=True)
class Node:
    """One node's GPUs of a model: the device indices an instance can be given."""

    index: int
    devices: tuple[int, ...]
    #: Its Kubernetes name (None for this machine).
    name: str | None = None
    #: None: this machine's (the local backend's instances share the host).
    resources: NodeResources | None = None


@attrs.frozen(kw_only=True)
class GpuModel:
    """All GPUs of one model in the cluster."""

    name: str
    product: str
    memory: str | None
    nodes: tuple[Node, ...]
    source: Source
    driver_version: str | None = None
    #: Nodes with GPUs of this model that cannot take pods now (not Ready, cordoned).
    unschedulable: tuple[Node, ...] = ()

    @property
    def capacity(self) -> int:
        return sum(len(n.devices) for n in self.nodes)


@attrs.frozen(kw_only=True)
class Inventory:
    """The GPUs a cluster offers."""

    models: tuple[GpuModel, ...]
    #: Register multi-node instance types too (a Kubernetes cluster whose settings ask for them).
    multi_node: bool = False

    def model(self, name: str) -> GpuModel | None:
        for model in self.models:
            if model.name.upper() == name.upper():
                return model
        return None


def static_inventory(gpus: Sequence[GpuSettings]) -> Inventory:
    """The configured (fake) inventory: ``nodes`` nodes of ``count`` GPUs each, devices 0..count-1."""
    return Inventory(
        models=tuple(
            GpuModel(
                name=g.name.upper(),
                product=g.product or f"NVIDIA-{g.name.upper()}",
                memory=g.memory,
                nodes=tuple(Node(index=i, devices=tuple(range(g.count))) for i in range(g.nodes)),
                source="static",
            )
            for g in gpus
        )
    )


def parse_nvidia_smi(text: str) -> Inventory:
    """Read ``nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader,nounits``."""
    found: dict[str, list[tuple[int, str, str | None, str | None]]] = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 2 or not parts[0].isdigit():
            continue
        index, product = int(parts[0]), parts[1]
        memory = f"{int(parts[2]) // 1024}GB" if len(parts) > 2 and parts[2].isdigit() else None
        driver = parts[3] if len(parts) > 3 and parts[3] and parts[3] != "[N/A]" else None
        found.setdefault(gpu_model_name(product), []).append((index, product, memory, driver))
    return Inventory(
        models=tuple(
            GpuModel(
                name=name,
                product=rows[0][1],
                memory=rows[0][2],
                nodes=(Node(index=0, devices=tuple(r[0] for r in rows)),),
                source="nvidia-smi",
                driver_version=rows[0][3],
            )
            for name, rows in sorted(found.items())
        )
    )


def discover_nvidia_smi(binary: str = "nvidia-smi", timeout: float = 10.0) -> Inventory | None:
    """The real GPUs of this machine; None when nvidia-smi is absent or fails (blocking: call in a thread)."""
    path = shutil.which(binary)
    if path is None:
        return None
    try:
        out = subprocess.run(
            [path, "--query-gpu=index,name,memory.total,driver_version", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    inventory = parse_nvidia_smi(out)
    return inventory if inventory.models else None


def discover(mode: str, configured: Sequence[GpuSettings]) -> Inventory:
    """The inventory for a cluster's ``gpu_discovery`` setting (blocking: call in a thread)."""
    if mode != "static":
        real = discover_nvidia_smi()
        if real is not None:
            return real
        if mode == "nvidia-smi":
            return Inventory(models=())
    return static_inventory(configured)


def _sizes(node_counts: Iterable[int]) -> list[int]:
    """NVCA's instance sizes: 1, 2, 4, ... below each node's GPU count, plus that count."""
    sizes: set[int] = set()
    for count in node_counts:
        n = 1
        while n < count:
            sizes.add(n)
            n *= 2
        sizes.add(count)
    return sorted(sizes)


def _cpu_arch() -> str:
    machine = platform.machine().lower()
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)


def _system_memory() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0


def _gib(n: float) -> str:
    return f"{max(1, int(n) // 1024**3)}G"


def _share(nodes: Sequence[Node], size: int, total: int) -> tuple[int, str | None, str | None]:
    """CPU cores, memory and storage one instance of ``size`` GPUs gets on the least generous node
    (on this machine: its share of all ``total`` GPUs).
    """
    sized = [(n.resources, size / len(n.devices)) for n in nodes if n.resources is not None and n.devices]
    if not sized:
        cpus, memory = os.cpu_count() or 1, _system_memory()
        return max(1, int(cpus * size / total)), (_gib(memory * size / total) if memory else None), None
    cpu = min(r.cpu_cores * f for r, f in sized)
    mem = min(r.memory * f for r, f in sized)
    storage = [r.storage * f for r, f in sized if r.storage]
    return max(1, int(cpu)), _gib(mem), (_gib(min(storage)) if storage else None)


def instance_limits(inventory: Inventory, allocation: Allocation) -> tuple[int, str | None]:
    """CPU cores and memory (``<n>G``) of the instance type ``allocation`` was made for: a container's limits."""
    model = inventory.model(allocation.gpu)
    size = max(len(allocation.devices), 1)
    fitting = [n for n in model.nodes if len(n.devices) >= size] if model is not None else []
    cpu, memory, _ = _share(fitting, size, max(sum(m.capacity for m in inventory.models), 1))
    return cpu, memory


def _node_fact(nodes: Sequence[Node], key: str, default: str) -> str:
    for node in nodes:
        value = getattr(node.resources, key, None) if node.resources is not None else None
        if value:
            return str(value)
    return default


def registered_gpus(inventory: Inventory, provider: str) -> tuple[ClusterGpu, ...]:
    """The ``gpus`` of a registration: capacity and instance types (``<provider>.GPU.<gpu>_<n>x``) per model.

    Single-node types fit ``1, 2, 4, ...`` GPUs below a node's count, plus the count; ``maxInstances`` sums
    what fits on each schedulable node, ``unschedulableCapacity`` the same over the others. With
    ``inventory.multi_node``, whole-node types ``_<g>x.x<nodes>`` span 2..N nodes of ``g`` GPUs.
    """
    out = []
    total = max(sum(m.capacity for m in inventory.models), 1)
    for model in inventory.models:
        counts = [len(n.devices) for n in model.nodes]
        blocked = [len(n.devices) for n in model.unschedulable]
        common: dict[str, Any] = {
            "value": f"{provider}.GPU.{model.name}",
            "gpu_memory": model.memory,
            "cpu_arch": _node_fact(model.nodes, "cpu_arch", _cpu_arch()),
            "os": _node_fact(model.nodes, "os", platform.system().lower()),
            "driver_version": model.driver_version,
        }
        types = []
        for i, size in enumerate(_sizes(counts)):
            fitting = [n for n in model.nodes if len(n.devices) >= size]
            cpu, memory, storage = _share(fitting, size, total)
            types.append(
                InstanceType(
                    name=instance_type_name(provider, model.name, size),
                    gpu_count=size,
                    max_instances=sum(c // size for c in counts),
                    unschedulable_capacity=sum(c // size for c in blocked) if model.source == "kubernetes" else None,
                    description=f"{size}x {model.product}",
                    default=i == 0,
                    cpu_cores=cpu,
                    system_memory=memory,
                    storage=storage,
                    **common,
                )
            )
        if inventory.multi_node:
            for per_node in sorted(set(counts)):
                whole = [n for n in model.nodes if len(n.devices) == per_node]
                cpu, memory, storage = _share(whole, per_node, total)
                for nodes in range(2, len(whole) + 1):
                    types.append(
                        InstanceType(
                            name=instance_type_name(provider, model.name, per_node, nodes),
                            gpu_count=per_node * nodes,
                            nodes=nodes,
                            max_instances=len(whole) // nodes,
                            description=f"{nodes} nodes of {per_node}x {model.product}",
                            cpu_cores=cpu * nodes,
                            system_memory=memory,
                            storage=storage,
                            **common,
                        )
                    )
        out.append(ClusterGpu(name=model.name, capacity=model.capacity, instance_types=tuple(types)))
    return tuple(out)


@attrs.frozen(kw_only=True)
class Allocation:
    """GPUs given to one instance."""

    gpu: str
    node: int
    devices: tuple[int, ...]


class Allocator:
    """Which devices are taken; instances get devices of one node (best fit), never shared."""

    def __init__(self, inventory: Inventory) -> None:
        self.inventory = inventory
        self._used: dict[tuple[str, int], set[int]] = {}

    def replace_inventory(self, inventory: Inventory) -> None:
        """New discovery results; what is allocated stays allocated."""
        self.inventory = inventory

    def free(self, gpu: str) -> int:
        model = self.inventory.model(gpu)
        if model is None:
            return 0
        return sum(
            len(n.devices) - len(self._used.get((model.name, n.index), set()) & set(n.devices)) for n in model.nodes
        )

    def allocated(self, gpu: str) -> int:
        name = gpu.upper()
        return sum(len(devices) for (g, _), devices in self._used.items() if g == name)

    def allocate(self, gpu: str, count: int) -> Allocation | None:
        """``count`` free devices of one node, preferring the fullest node that fits; None if none does."""
        model = self.inventory.model(gpu)
        if model is None:
            return None
        best: tuple[int, Node, list[int]] | None = None
        for node in model.nodes:
            used = self._used.get((model.name, node.index), set())
            free = [d for d in node.devices if d not in used]
            if len(free) >= count and (best is None or len(free) < best[0]):
                best = (len(free), node, free)
        if best is None:
            return None
        devices = tuple(best[2][:count])
        self.reserve(Allocation(gpu=model.name, node=best[1].index, devices=devices))
        return Allocation(gpu=model.name, node=best[1].index, devices=devices)

    def reserve(self, allocation: Allocation) -> None:
        """Mark devices taken (an instance re-adopted after a restart)."""
        self._used.setdefault((allocation.gpu.upper(), allocation.node), set()).update(allocation.devices)

    def release(self, allocation: Allocation) -> None:
        used = self._used.get((allocation.gpu.upper(), allocation.node))
        if used is not None:
            used.difference_update(allocation.devices)

    def usage(self) -> dict[str, GpuUsage]:
        """Heartbeat ``gpuUsage``: capacity is the ``_1x`` type's maxInstances, i.e. every GPU."""
        out = {}
        for model in self.inventory.models:
            allocated = self.allocated(model.name)
            out[model.name] = GpuUsage(
                capacity=model.capacity, allocated=allocated, available=max(model.capacity - allocated, 0)
            )
        return out
