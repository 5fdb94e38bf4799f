"""GPU discovery from Kubernetes nodes: NVCA's node selection, GPU names and instance types."""

from __future__ import annotations

from typing import Any

from nvcf_mono.planes.compute.backends.kubernetes.discovery import instance_type_labels, inventory, quantity
from nvcf_mono.planes.compute.gpus import registered_gpus


def node(name: str, product: str | None, gpus: int, *, ready: bool = True, **labels: str) -> dict[str, Any]:
    node_labels = dict(labels)
    if product is not None:
        node_labels |= {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": product}
    return {
        "metadata": {"name": name, "labels": node_labels},
        "spec": {},
        "status": {
            "allocatable": {"cpu": "96", "memory": "1024Gi", "ephemeral-storage": "800Gi", "nvidia.com/gpu": str(gpus)},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux"},
        },
    }


NODES = [
    node("h-1", "NVIDIA-H100-80GB-HBM3", 8),
    node("h-2", "NVIDIA-H100-80GB-HBM3", 8),
    node("l-1", "NVIDIA-L40S", 4),
    node("l-2", "NVIDIA-L40S", 4, ready=False),
    node("cpu-1", None, 0),
]


def test_quantities() -> None:
    assert quantity("500m") == 0.5
    assert quantity("64Gi") == 64 * 1024**3
    assert quantity("8") == 8
    assert quantity("nonsense") == 0


def test_ready_gpu_nodes_register_nvca_instance_types_and_capacities() -> None:
    inv = inventory(NODES)
    h100, l40s = registered_gpus(inv, "ON-PREM")
    assert (h100.name, h100.capacity) == ("H100", 16)
    assert [(t.name, t.max_instances) for t in h100.instance_types] == [
        ("ON-PREM.GPU.H100_1x", 16),
        ("ON-PREM.GPU.H100_2x", 8),
        ("ON-PREM.GPU.H100_4x", 4),
        ("ON-PREM.GPU.H100_8x", 2),
    ]
    one = h100.instance_types[0]
    assert one.default and one.value == "ON-PREM.GPU.H100"
    # A node's CPUs and memory are shared by its GPUs: 96 cores and 1 TiB over 8.
    assert (one.cpu_cores, one.system_memory, one.cpu_arch, one.os) == (12, "128G", "amd64", "linux")
    # The not-Ready L40S node does not count, but shows as unschedulable capacity.
    assert (l40s.name, l40s.capacity) == ("L40S", 4)
    assert [(t.name, t.max_instances, t.unschedulable_capacity) for t in l40s.instance_types] == [
        ("ON-PREM.GPU.L40S_1x", 4, 4),
        ("ON-PREM.GPU.L40S_2x", 2, 2),
        ("ON-PREM.GPU.L40S_4x", 1, 1),
    ]


def test_multi_node_types_span_whole_nodes() -> None:
    inv = inventory(NODES)
    import attrs

    h100 = registered_gpus(attrs.evolve(inv, multi_node=True), "DGX-CLOUD")[0]
    multi = [t for t in h100.instance_types if t.nodes > 1]
    assert [(t.name, t.gpu_count, t.max_instances) for t in multi] == [("DGX-CLOUD.GPU.H100_8x.x2", 16, 1)]


def test_the_override_label_names_the_gpu_and_cordoned_nodes_do_not_count() -> None:
    overridden = node("o-1", "NVIDIA-H100-80GB-HBM3", 8, **{"nvca.nvcf.nvidia.io/gpu.product": "NVIDIA-GH200-480GB"})
    cordoned = node("c-1", "NVIDIA-A100-SXM4-80GB", 8)
    cordoned["spec"]["unschedulable"] = True
    inv = inventory([overridden, cordoned])
    assert {m.name: m.capacity for m in inv.models} == {"GH200": 8, "A100": 0}


def test_gpu_nodes_get_their_instance_type_label() -> None:
    labelled = node("h-3", "NVIDIA-H100-80GB-HBM3", 8, **{"nvca.nvcf.nvidia.io/instance-type": "ON-PREM.GPU.H100"})
    assert instance_type_labels([*NODES, labelled], "ON-PREM") == {
        "h-1": "ON-PREM.GPU.H100",
        "h-2": "ON-PREM.GPU.H100",
        "l-1": "ON-PREM.GPU.L40S",
        "l-2": "ON-PREM.GPU.L40S",
    }
