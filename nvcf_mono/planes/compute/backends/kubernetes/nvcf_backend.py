"""The cluster's ``NVCFBackend`` object (reference compute-plane §2): what the agent takes from it, and the
status it reports back.

NVCA's operator writes one per GPU cluster (namespace ``nvca-operator``). When the agent finds it,
its cluster-level settings win over the agent's configuration: the attributes (``NVLinkOptimized``,
isolation), GPU discovery (``dynamic`` from the nodes or ``static`` from ``gpuConfig``) and the
feature gates ``DynamicGPUDiscovery``, ``MultiNodeWorkloads`` and ``HelmMiniService`` (Helm functions;
``-Name`` turns a gate off). ``overrides`` win over the rest of the spec. Pure: the object in, a
:class:`BackendSettings` out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from nvcf_mono.contracts import kube_labels
from nvcf_mono.mappings import deep_merged
from nvcf_mono.planes.compute.config import GpuSettings

GROUP, VERSION, PLURAL = kube_labels.NVCF_BACKEND_GROUP, "v1", "nvcfbackends"
RESOURCE = (GROUP, VERSION, PLURAL)


@attrs.frozen(kw_only=True)
class BackendSettings:
    """What the agent takes from the cluster's NVCFBackend."""

    name: str
    #: The cluster's attributes (None: the spec names none; the configured ones stay).
    attributes: tuple[str, ...] | None = None
    #: Static GPU discovery's inventory (None: dynamic, from the nodes).
    static_gpus: tuple[GpuSettings, ...] | None = None
    #: The ``MultiNodeWorkloads`` gate (None: not named; the configured setting stays).
    multi_node: bool | None = None
    #: Helm functions may run here (the ``HelmMiniService`` gate, on unless turned off).
    helm: bool = True


def _merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        out[key] = (
            _merge(out[key], value) if isinstance(value, Mapping) and isinstance(out.get(key), Mapping) else value
        )
    return out


def _gates(values: Any) -> dict[str, bool]:
    """``[Name, -Other]`` -> {Name: True, Other: False}."""
    out = {}
    for value in values if isinstance(values, list) else ():
        text = str(value).strip()
        if text:
            out[text.lstrip("-+")] = not text.startswith("-")
    return out


def _static_gpus(static: Mapping[str, Any]) -> tuple[GpuSettings, ...]:
    """NVCA's static ``gpuConfig`` (registration entries ``{name, capacity, instanceTypes[{gpuCount, gpuMemory}]}``)."""
    found = []
    for entry in static.get("gpuConfig") or ():
        if not isinstance(entry, Mapping) or not entry.get("name"):
            continue
        capacity = int(entry.get("capacity") or 0)
        types = [t for t in entry.get("instanceTypes") or () if isinstance(t, Mapping)]
        per_node = max((int(t.get("gpuCount") or 0) for t in types), default=0) or capacity
        if capacity <= 0 or per_node <= 0:
            continue
        memory = next((str(t["gpuMemory"]) for t in types if t.get("gpuMemory")), None)
        gpus = GpuSettings(name=str(entry["name"]), count=per_node, nodes=max(1, capacity // per_node))
        found.append(attrs.evolve(gpus, memory=memory) if memory else gpus)
    return tuple(found)


def settings_of(obj: Mapping[str, Any]) -> BackendSettings:
    """The agent's view of one NVCFBackend object."""
    raw = obj.get("spec") or {}
    spec = deep_merged(raw, raw.get("overrides") or {}) if isinstance(raw, Mapping) else {}
    cluster = spec.get("clusterConfig") or {}
    gates = _gates((spec.get("featureGate") or {}).get("values"))
    discovery = cluster.get("gpuDiscovery") or {}
    static = discovery.get("static") if isinstance(discovery, Mapping) else None
    static_gpus = None
    if isinstance(static, Mapping) or gates.get("DynamicGPUDiscovery") is False:
        static_gpus = _static_gpus(static) if isinstance(static, Mapping) else ()
    attributes = cluster.get("attributes")
    return BackendSettings(
        name=str((obj.get("metadata") or {}).get("name", "")),
        attributes=tuple(str(a) for a in attributes) if isinstance(attributes, list) else None,
        static_gpus=static_gpus,
        multi_node=gates.get("MultiNodeWorkloads"),
        helm=gates.get("HelmMiniService", True),
    )


def agent_status(*, healthy: bool, kubernetes_version: str | None, now: str, changed: bool) -> dict[str, Any]:
    """The agent's report in the object's status (``kubectl wait ... --for=jsonpath={.status.agentStatus}``)."""
    status: dict[str, Any] = {"agentStatus": "Healthy" if healthy else "Unhealthy", "lastUpdated": now}
    if kubernetes_version:
        status["kubernetesVersion"] = kubernetes_version
    if changed:
        status["lastUpdatedAgentStatus"] = now
    return status
