"""GPU discovery from Kubernetes nodes (reference compute-plane §6, NVCA's dynamic discovery).

Pure: node objects (dicts, as the API returns them) in, the cluster's :class:`Inventory` out, and
the instance-type label each GPU node should carry.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from nvcf_mono.planes.compute.backends.kubernetes.manifests import INSTANCE_TYPE_LABEL
from nvcf_mono.planes.compute.gpus import GpuModel, Inventory, Node, NodeResources, gpu_model_name

GPU_PRESENT = "nvidia.com/gpu.present"
PRODUCT_OVERRIDE = "nvca.nvcf.nvidia.io/gpu.product"
PRODUCT = "nvidia.com/gpu.product"
GPU_RESOURCE = "nvidia.com/gpu"
SHARED_RESOURCE = "nvidia.com/gpu.shared"

_QUANTITY_RX = re.compile(r"^([0-9.]+)([a-zA-Z]*)$")
_SUFFIX = {
    "": 1,
    "m": 1e-3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "Ki": 1024,
    "Mi": 1024**2,
    "Gi": 1024**3,
    "Ti": 1024**4,
    "Pi": 1024**5,
}


def quantity(text: object) -> float:
    """A Kubernetes quantity (``16``, ``500m``, ``64Gi``) as a number; 0 when unreadable."""
    m = _QUANTITY_RX.match(str(text).strip())
    if m is None or m[2] not in _SUFFIX:
        return 0.0
    try:
        return float(m[1]) * _SUFFIX[m[2]]
    except ValueError:
        return 0.0


def _labels(node: Mapping[str, Any]) -> Mapping[str, str]:
    return node.get("metadata", {}).get("labels") or {}


def is_gpu_node(node: Mapping[str, Any]) -> bool:
    return str(_labels(node).get(GPU_PRESENT, "")).lower() == "true"


def schedulable(node: Mapping[str, Any]) -> bool:
    """Ready and not cordoned."""
    if node.get("spec", {}).get("unschedulable"):
        return False
    conditions = node.get("status", {}).get("conditions") or ()
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def product_of(node: Mapping[str, Any]) -> str | None:
    labels = _labels(node)
    return labels.get(PRODUCT_OVERRIDE) or labels.get(PRODUCT)


def gpu_name(node: Mapping[str, Any]) -> str | None:
    """NVCF's GPU name of a node (the override label first), or None without a product label."""
    product = product_of(node)
    return gpu_model_name(product) if product else None


def _gpu_count(node: Mapping[str, Any], product: str) -> int:
    allocatable = node.get("status", {}).get("allocatable") or {}
    resource = SHARED_RESOURCE if product.upper().endswith("-SHARED") else GPU_RESOURCE
    return int(quantity(allocatable.get(resource, 0)))


def _driver(labels: Mapping[str, str]) -> str | None:
    parts = [labels.get(f"nvidia.com/cuda.driver.{p}") for p in ("major", "minor", "rev")]
    if not parts[0]:
        return None
    return ".".join(p for p in parts if p)


def _memory(labels: Mapping[str, str]) -> str | None:
    mib = quantity(labels.get("nvidia.com/gpu.memory", ""))
    return f"{round(mib / 1024)}GB" if mib else None


def _resources(node: Mapping[str, Any]) -> NodeResources:
    allocatable = node.get("status", {}).get("allocatable") or {}
    info = node.get("status", {}).get("nodeInfo") or {}
    storage = quantity(allocatable.get("ephemeral-storage", 0))
    return NodeResources(
        cpu_cores=quantity(allocatable.get("cpu", 0)),
        memory=int(quantity(allocatable.get("memory", 0))),
        storage=int(storage) if storage else None,
        cpu_arch=info.get("architecture") or _labels(node).get("kubernetes.io/arch"),
        os=info.get("operatingSystem") or _labels(node).get("kubernetes.io/os"),
    )


def _description(labels: Mapping[str, str], product: str) -> str:
    family, machine = labels.get("nvidia.com/gpu.family"), labels.get("nvidia.com/gpu.machine")
    extra = ", ".join(x for x in (family, machine) if x)
    return f"{product} ({extra})" if extra else product


def inventory(nodes: Iterable[Mapping[str, Any]]) -> Inventory:
    """The GPUs of the nodes labelled ``nvidia.com/gpu.present=true``, by model, sorted by node name."""
    by_model: dict[str, dict[str, Any]] = {}
    for node in sorted(nodes, key=lambda n: n.get("metadata", {}).get("name", "")):
        product = product_of(node)
        if not is_gpu_node(node) or not product:
            continue
        count = _gpu_count(node, product)
        if count <= 0:
            continue
        name = gpu_model_name(product)
        labels = _labels(node)
        entry = by_model.setdefault(
            name,
            {
                "product": _description(labels, product),
                "memory": _memory(labels),
                "driver": _driver(labels),
                "ready": [],
                "blocked": [],
            },
        )
        target = entry["ready"] if schedulable(node) else entry["blocked"]
        target.append(
            Node(
                index=len(entry["ready"]) + len(entry["blocked"]),
                devices=tuple(range(count)),
                name=node.get("metadata", {}).get("name"),
                resources=_resources(node),
            )
        )
    return Inventory(
        models=tuple(
            GpuModel(
                name=name,
                product=entry["product"],
                memory=entry["memory"],
                nodes=tuple(entry["ready"]),
                unschedulable=tuple(entry["blocked"]),
                source="kubernetes",
                driver_version=entry["driver"],
            )
            for name, entry in sorted(by_model.items())
        )
    )


def instance_type_labels(nodes: Iterable[Mapping[str, Any]], provider: str) -> dict[str, str]:
    """Node name -> the ``nvca.nvcf.nvidia.io/instance-type`` value it should carry, where it differs."""
    out = {}
    for node in nodes:
        name = gpu_name(node) if is_gpu_node(node) else None
        if name is None:
            continue
        want = f"{provider}.GPU.{name}"
        if _labels(node).get(INSTANCE_TYPE_LABEL) != want:
            out[node["metadata"]["name"]] = want
    return out
