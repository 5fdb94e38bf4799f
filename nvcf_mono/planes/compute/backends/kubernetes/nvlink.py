"""NVLink partitioning of pods on clusters with the attribute ``NVLinkOptimized=true`` (reference
compute-plane §5, "NVLink partition mutation").

Every GPU container joins the partition's DRA claim; the pod carries a partition label derived from
its namespace (and index), and pods of one partition attract each other on the same NVLink clique:
required when the pod names its domain index, preferred otherwise. Nodes must belong to a clique.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Mapping
from typing import Any

NVLINK_ATTRIBUTE = "NVLinkOptimized=true"
CLAIM_NAME = "nvcf-cd-index-0"
CLAIM_TEMPLATE = "nvcf-cd-channel-0"
PARTITION_LABEL = "dra.nvcf.nvidia.io/nvlink-domain-partition"
DOMAIN_INDEX_ANNOTATION = "dra.nvcf.nvidia.io/required-nvlink-domain-index"
CLIQUE_KEY = "nvidia.com/gpu.clique"
GPU_RESOURCES = ("nvidia.com/gpu", "nvidia.com/pgpu", "nvidia.com/gpu.shared")


def nvlink_enabled(attributes: tuple[str, ...]) -> bool:
    return any(a.replace(" ", "").lower() == NVLINK_ATTRIBUTE.lower() for a in attributes)


def partition(namespace: str, index: str | None = None) -> str:
    """``x`` + 18 hex characters of sha256(namespace[+index]) + ``x`` (a valid label value either way)."""
    digest = hashlib.sha256((namespace + (index or "")).encode()).hexdigest()[:18]
    return f"x{digest}x"


def _wants_gpu(container: Mapping[str, Any]) -> bool:
    resources = container.get("resources") or {}
    names = {*(resources.get("limits") or {}), *(resources.get("requests") or {})}
    return any(n in GPU_RESOURCES or n.startswith("nvidia.com/mig-") for n in names)


def _term(value: str) -> dict[str, Any]:
    return {
        "labelSelector": {"matchExpressions": [{"key": PARTITION_LABEL, "operator": "In", "values": [value]}]},
        "topologyKey": CLIQUE_KEY,
    }


def mutate(
    pod: Mapping[str, Any],
    namespace: str,
    *,
    claim_name: str = CLAIM_NAME,
    claim_template: str = CLAIM_TEMPLATE,
) -> dict[str, Any]:
    """The pod with the NVLink mutation applied (the input is not changed)."""
    out = copy.deepcopy(dict(pod))
    meta = out.setdefault("metadata", {})
    spec = out.setdefault("spec", {})
    index = (meta.get("annotations") or {}).get(DOMAIN_INDEX_ANNOTATION)
    required = index is not None and str(index).strip() != ""
    value = partition(namespace, str(index).strip()) if required else partition(namespace)
    meta.setdefault("labels", {})[PARTITION_LABEL] = value

    touched = False
    for key in ("initContainers", "containers"):
        for container in spec.get(key) or ():
            if _wants_gpu(container):
                claims = container.setdefault("resources", {}).setdefault("claims", [])
                if not any(c.get("name") == claim_name for c in claims):
                    claims.append({"name": claim_name})
                touched = True
    if touched:
        claims = spec.setdefault("resourceClaims", [])
        if not any(c.get("name") == claim_name for c in claims):
            claims.append({"name": claim_name, "resourceClaimTemplateName": claim_template})

    affinity = spec.setdefault("affinity", {})
    pod_affinity = affinity.setdefault("podAffinity", {})
    if required:
        pod_affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", []).append(_term(value))
    else:
        pod_affinity.setdefault("preferredDuringSchedulingIgnoredDuringExecution", []).append(
            {"weight": 100, "podAffinityTerm": _term(value)}
        )
    # Always: only nodes of an NVLink clique. Added to every term (terms are ORed; expressions ANDed).
    node_affinity = affinity.setdefault("nodeAffinity", {})
    required_nodes = node_affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = required_nodes.setdefault("nodeSelectorTerms", [])
    if not terms:
        terms.append({})
    for term in terms:
        exprs = term.setdefault("matchExpressions", [])
        if not any(e.get("key") == CLIQUE_KEY for e in exprs):
            exprs.append({"key": CLIQUE_KEY, "operator": "Exists"})
    return out


def compute_domain(name: str, namespace: str, claim_template: str, nodes: int) -> dict[str, Any]:
    """The NVIDIA DRA driver's ComputeDomain whose channel template the pods claim."""
    return {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "ComputeDomain",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"numNodes": nodes, "channel": {"resourceClaimTemplate": {"name": claim_template}}},
    }
