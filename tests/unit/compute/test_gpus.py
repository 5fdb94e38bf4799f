"""GPU naming, discovery parsing, instance types and device allocation (reference compute-plane §6)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nvcf_mono.planes.compute.config import GpuSettings
from nvcf_mono.planes.compute.gpus import (
    Allocator,
    discover,
    gpu_model_name,
    parse_nvidia_smi,
    registered_gpus,
    static_inventory,
)


@pytest.mark.parametrize(
    ("product", "name"),
    [
        ("NVIDIA-H100-80GB-HBM3", "H100"),
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA L40S", "L40S"),
        ("Tesla T4", "T4"),
        ("NVIDIA GeForce RTX 4090", "RTX4090"),
        ("NVIDIA RTX A6000", "RTXA6000"),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "RTXPRO6000"),
        ("NVIDIA-H100-PCIe", "H100"),
    ],
)
def test_gpu_names_follow_nvca(product: str, name: str) -> None:
    assert gpu_model_name(product) == name


def test_instance_types_capacity_and_max_instances() -> None:
    inventory = static_inventory([GpuSettings(name="h100", count=8, nodes=2), GpuSettings(name="L40S", count=6)])
    h100, l40s = registered_gpus(inventory, "ON-PREM")
    assert h100.name == "H100" and h100.capacity == 16
    assert [(t.name, t.gpu_count, t.max_instances) for t in h100.instance_types] == [
        ("ON-PREM.GPU.H100_1x", 1, 16),
        ("ON-PREM.GPU.H100_2x", 2, 8),
        ("ON-PREM.GPU.H100_4x", 4, 4),
        ("ON-PREM.GPU.H100_8x", 8, 2),
    ]
    assert [t.default for t in h100.instance_types] == [True, False, False, False]
    assert {t.value for t in h100.instance_types} == {"ON-PREM.GPU.H100"}
    # 1, 2, 4 below six, and six itself.
    assert [(t.gpu_count, t.max_instances) for t in l40s.instance_types] == [(1, 6), (2, 3), (4, 1), (6, 1)]
    assert l40s.instance_types[0].gpu_memory == "80GB" and l40s.instance_types[0].cpu_cores


def test_nvidia_smi_output_is_grouped_by_model() -> None:
    text = "0, NVIDIA H200, 143771, 570.124.06\n1, NVIDIA H200, 143771, 570.124.06\n2, NVIDIA L40S, 46068, 570.124.06\n"
    inventory = parse_nvidia_smi(text)
    assert [(m.name, m.capacity, m.source) for m in inventory.models] == [
        ("H200", 2, "nvidia-smi"),
        ("L40S", 1, "nvidia-smi"),
    ]
    h200 = inventory.model("h200")
    assert h200 is not None and h200.nodes[0].devices == (0, 1) and h200.memory == "140GB"
    assert h200.driver_version == "570.124.06"
    assert parse_nvidia_smi("No devices were found\n").models == ()


def test_allocation_takes_one_node_best_fit_and_never_twice() -> None:
    alloc = Allocator(static_inventory([GpuSettings(name="H100", count=4, nodes=2)]))
    first = alloc.allocate("H100", 2)
    assert first is not None and len(first.devices) == 2
    # The next 2 go to the same, fuller node; the 4 after that need the other, empty one.
    second = alloc.allocate("h100", 2)
    assert second is not None and second.node == first.node and set(second.devices).isdisjoint(first.devices)
    whole = alloc.allocate("H100", 4)
    assert whole is not None and whole.node != first.node
    assert alloc.allocate("H100", 1) is None and alloc.free("H100") == 0
    assert alloc.usage()["H100"].allocated == 8 and alloc.usage()["H100"].available == 0
    alloc.release(second)
    assert alloc.free("H100") == 2 and alloc.allocate("H100", 4) is None
    assert alloc.allocate("A100", 1) is None


def test_a_request_bigger_than_any_node_never_fits() -> None:
    alloc = Allocator(static_inventory([GpuSettings(name="H100", count=2, nodes=4)]))
    assert alloc.free("H100") == 8 and alloc.allocate("H100", 4) is None


def test_auto_discovery_uses_nvidia_smi_when_present(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho '0, NVIDIA H200, 143771, 570.1'\necho '1, NVIDIA H200, 143771, 570.1'\n")
    fake.chmod(0o755)
    configured = [GpuSettings(name="H100", count=8)]
    monkeypatch.setenv("PATH", str(tmp_path))
    found = discover("auto", configured)
    assert [(m.name, m.capacity, m.source) for m in found.models] == [("H200", 2, "nvidia-smi")]
    assert [m.name for m in discover("static", configured).models] == ["H100"]
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    assert [(m.name, m.source) for m in discover("auto", configured).models] == [("H100", "static")]
    assert discover("nvidia-smi", configured).models == ()
