"""The NVLink partition mutation on NVLinkOptimized clusters (reference compute-plane §5)."""

from __future__ import annotations

import hashlib

from nvcf_mono.planes.compute.backends.kubernetes.nvlink import mutate, nvlink_enabled, partition

POD = {
    "metadata": {"name": "p", "labels": {"app": "x"}},
    "spec": {
        "containers": [
            {"name": "inference", "resources": {"limits": {"nvidia.com/gpu": "8"}}},
            {"name": "utils", "resources": {}},
        ],
        "initContainers": [{"name": "mig", "resources": {"requests": {"nvidia.com/mig-1g.10gb": "1"}}}],
    },
}


def test_the_partition_label_is_x_18_hex_x_of_the_namespace_and_index() -> None:
    assert partition("sr-abc") == "x" + hashlib.sha256(b"sr-abc").hexdigest()[:18] + "x"
    assert partition("sr-abc", "2") == "x" + hashlib.sha256(b"sr-abc2").hexdigest()[:18] + "x"


def test_an_unannotated_pod_prefers_its_partition_and_requires_a_clique() -> None:
    out = mutate(POD, "sr-abc")
    value = partition("sr-abc")
    assert out["metadata"]["labels"] == {"app": "x", "dra.nvcf.nvidia.io/nvlink-domain-partition": value}
    containers = {c["name"]: c for c in out["spec"]["containers"] + out["spec"]["initContainers"]}
    assert containers["inference"]["resources"]["claims"] == [{"name": "nvcf-cd-index-0"}]
    assert containers["mig"]["resources"]["claims"] == [{"name": "nvcf-cd-index-0"}]
    assert "claims" not in containers["utils"]["resources"]
    assert out["spec"]["resourceClaims"] == [
        {"name": "nvcf-cd-index-0", "resourceClaimTemplateName": "nvcf-cd-channel-0"}
    ]
    affinity = out["spec"]["affinity"]
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in affinity["podAffinity"]
    assert affinity["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] == [
        {
            "weight": 100,
            "podAffinityTerm": {
                "labelSelector": {
                    "matchExpressions": [
                        {"key": "dra.nvcf.nvidia.io/nvlink-domain-partition", "operator": "In", "values": [value]}
                    ]
                },
                "topologyKey": "nvidia.com/gpu.clique",
            },
        }
    ]
    assert affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "nvidia.com/gpu.clique", "operator": "Exists"}]}]
    }
    assert "affinity" not in POD["spec"]  # the input is left alone


def test_an_annotated_pod_requires_its_indexed_partition() -> None:
    pod = {**POD, "metadata": {"name": "p", "annotations": {"dra.nvcf.nvidia.io/required-nvlink-domain-index": "3"}}}
    instance_type = {
        "matchExpressions": [{"key": "nvca.nvcf.nvidia.io/instance-type", "operator": "In", "values": ["A"]}]
    }
    pod["spec"] = {
        **POD["spec"],
        "affinity": {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [instance_type]}}
        },
    }
    out = mutate(pod, "sr-abc")
    value = partition("sr-abc", "3")
    assert out["metadata"]["labels"]["dra.nvcf.nvidia.io/nvlink-domain-partition"] == value
    affinity = out["spec"]["affinity"]
    assert affinity["podAffinity"] == {
        "requiredDuringSchedulingIgnoredDuringExecution": [
            {
                "labelSelector": {
                    "matchExpressions": [
                        {"key": "dra.nvcf.nvidia.io/nvlink-domain-partition", "operator": "In", "values": [value]}
                    ]
                },
                "topologyKey": "nvidia.com/gpu.clique",
            }
        ]
    }
    # The instance-type requirement stays, and the clique requirement joins it (both must hold).
    (term,) = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert [e["key"] for e in term["matchExpressions"]] == [
        "nvca.nvcf.nvidia.io/instance-type",
        "nvidia.com/gpu.clique",
    ]


def test_the_attribute_turns_it_on() -> None:
    assert nvlink_enabled(("NVLinkOptimized=true",))
    assert not nvlink_enabled(("NVLinkOptimized=false", "HostIsolation=true"))
