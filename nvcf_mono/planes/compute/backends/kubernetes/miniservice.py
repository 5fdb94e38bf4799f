"""A Helm function or task installed as a MiniService (reference compute-plane §2 "MiniService", §5).

Pure: the rendered, validated objects and the launch spec in, everything to apply out: the request's
namespace, the MiniService object that tracks it, the ``utils`` pod running the worker, the secrets,
and the chart's objects with what NVCA's admission webhook would add (labels, env, tolerations,
pull secrets, the instance-type node affinity, NVLink partitioning).
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import yaml

from nvcf_mono.contracts import env
from nvcf_mono.planes.compute.backends import LaunchSpec
from nvcf_mono.planes.compute.backends.kubernetes import manifests, nvlink
from nvcf_mono.planes.compute.backends.kubernetes.manifests import Manifest
from nvcf_mono.planes.compute.config import KubernetesSettings
from nvcf_mono.reval.objects import ALLOWED, DEPRECATED, pod_spec, pod_template_metadata

MS_GROUP, MS_VERSION, MS_PLURAL = "nvca.nvcf.nvidia.io", "v1alpha1", "miniservices"
WORKLOAD_CONFIG = "nvcf-workload-config"
STATUS_BY_WORKER_READINESS = "StatusByWorkerReadiness"
WORKLOAD_TYPE_LABEL = "nvca.nvcf.nvidia.io/workload-instance-type"
MINISERVICE_LABEL = "nvca.nvcf.nvidia.io/miniservice-name"
FIELD_MANAGER = "nvcf-mono-agent"

# Phases (reference compute-plane §2).
INSTALLING, INSTALLED, STARTING, RUNNING, COMPLETED = "Installing", "Installed", "Starting", "Running", "Completed"
FAILED = "Failed"
#: Terminal before ``Running`` (``Failed`` is terminal after it).
INSTALL_FAILED = "InstallFailed"
#: MiniService phase -> the instance's aggregate state on its ICMSRequest (reference compute-plane §2).
AGGREGATE = {
    INSTALLING: "Scheduling",
    INSTALLED: "Scheduling",
    STARTING: "Pending",
    RUNNING: "Succeeded",
    COMPLETED: "Succeeded",
    FAILED: "Failed",
    INSTALL_FAILED: "Failed",
}

#: kind -> (group, version, plural) of what charts may contain (what the validator allows).
RESOURCES: dict[str, tuple[str, str, str]] = {
    kind: (group, version, plural) for (group, version, kind), plural in {**ALLOWED, **DEPRECATED}.items()
}
#: Applied first and deleted last (what others refer to).
_APPLY_ORDER = ["ServiceAccount", "Secret", "ConfigMap", "PersistentVolumeClaim", "Role", "RoleBinding", "Service"]


def resource_of(obj: Mapping[str, Any]) -> tuple[str, str, str]:
    """(group, version, plural) of an object (another kind: its lower-case plural, Kubernetes' convention)."""
    kind = str(obj.get("kind", ""))
    group, _, version = str(obj.get("apiVersion", "")).rpartition("/")
    if kind in RESOURCES and RESOURCES[kind][:2] == (group, version):
        return RESOURCES[kind]
    return group, version, kind.lower() + "s"


def apply_order(objects: Sequence[Manifest]) -> list[Manifest]:
    """Install order: what others refer to first, then workloads, unknown kinds last."""

    def rank(obj: Manifest) -> int:
        kind = obj.get("kind", "")
        return _APPLY_ORDER.index(kind) if kind in _APPLY_ORDER else len(_APPLY_ORDER) + (kind not in RESOURCES)

    return sorted(objects, key=rank)


@attrs.frozen(kw_only=True)
class WorkloadConfig:
    """What the chart's ``nvcf-workload-config`` ConfigMap asks for (it is read, never installed)."""

    feature_flags: Mapping[str, bool] = attrs.field(factory=dict)

    @property
    def by_worker_readiness(self) -> bool:
        return bool(self.feature_flags.get(STATUS_BY_WORKER_READINESS))


def split_workload_config(objects: Sequence[Manifest]) -> tuple[list[Manifest], WorkloadConfig]:
    """The objects to install, and the workload config the chart carries (if any)."""
    rest, flags = [], {}
    for obj in objects:
        if obj.get("kind") == "ConfigMap" and obj.get("metadata", {}).get("name") == WORKLOAD_CONFIG:
            text = (obj.get("data") or {}).get("config.yaml", "")
            try:
                doc = yaml.safe_load(text) or {}
            except yaml.YAMLError:
                doc = {}
            raw = doc.get("featureFlags") if isinstance(doc, dict) else None
            if isinstance(raw, dict):
                flags = {str(k): bool(v) for k, v in raw.items()}
            continue
        rest.append(obj)
    return rest, WorkloadConfig(feature_flags=flags)


def namespace_of(spec: LaunchSpec) -> str:
    return manifests.request_name(spec.request_id)


def miniservice_name(spec: LaunchSpec) -> str:
    return f"{namespace_of(spec)}"[:51] + "-miniservice"


def task_values(spec: LaunchSpec) -> dict[str, Any]:
    """The task contract as chart values (the chart's own keys win)."""
    msg = spec.message
    if msg.task_details is None:
        return {}
    return {
        "nvctNcaId": msg.nca_id,
        "nvctTaskId": msg.task_details.task_id,
        "nvctTaskName": msg.task_details.task_name or "",
        "nvctResultsDir": f"{manifests.TASK_DIR}/results",
        "nvctProgressFilePath": f"{manifests.TASK_DIR}/results/progress",
    }


def chart_values(spec: LaunchSpec) -> dict[str, Any]:
    configuration = spec.message.launch_specification.configuration
    values = dict(configuration) if isinstance(configuration, Mapping) else {}
    return {**task_values(spec), **values}


def labels(spec: LaunchSpec) -> dict[str, str]:
    out = manifests.instance_labels(spec)
    out.pop(manifests.INSTANCE_LABEL, None)  # the chart's objects belong to the instance's namespace, not a pod
    out[MINISERVICE_LABEL] = miniservice_name(spec)
    return out


def namespace(spec: LaunchSpec) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": namespace_of(spec),
            "labels": {**labels(spec), WORKLOAD_TYPE_LABEL: "miniservice"},
        },
    }


def miniservice(spec: LaunchSpec, config: WorkloadConfig) -> Manifest:
    """The cluster-scoped MiniService that tracks the install (its status carries the phase)."""
    launch = spec.message.launch_specification
    contract = launch.environment
    return {
        "apiVersion": f"{MS_GROUP}/{MS_VERSION}",
        "kind": "MiniService",
        "metadata": {"name": miniservice_name(spec), "labels": labels(spec)},
        "spec": {
            "namespace": namespace_of(spec),
            "icmsRequestName": manifests.request_name(spec.request_id),
            "helmChartConfig": {
                "url": launch.helm_chart,
                "serviceName": contract.get(env.HELM_CHART_INFERENCE_SERVICE_NAME, ""),
                "servicePort": int(contract.get(env.INFERENCE_PORT, "0") or 0),
                "values": json.dumps(chart_values(spec), sort_keys=True),
            },
            "workloadConfig": {"featureFlags": dict(config.feature_flags)},
        },
    }


def installing_status(objects: Sequence[Manifest]) -> Manifest:
    """The MiniService's status as the install starts: the phase and what the chart rendered to."""
    counts: dict[str, int] = {}
    for obj in objects:
        key = f"{obj.get('apiVersion')}/{obj.get('kind')}"
        counts[key] = counts.get(key, 0) + 1
    return {
        "phase": INSTALLING,
        "revision": 0,
        "renderedDetails": {
            "hash": rendered_hash(objects),
            "resources": [{"gvk": k, "count": v} for k, v in sorted(counts.items())],
        },
    }


def rendered_hash(objects: Sequence[Manifest]) -> str:
    return hashlib.sha256(json.dumps(list(objects), sort_keys=True).encode()).hexdigest()[:16]


def utils_pod(
    spec: LaunchSpec,
    settings: KubernetesSettings,
    *,
    pull_secrets: Sequence[str],
    ready_timeout: float,
    telemetry_proxy: str | None = None,
) -> Manifest:
    """The worker's own pod: it reaches the chart's Service ``<name>.<namespace>.svc.cluster.local:<port>``."""
    ns = namespace_of(spec)
    contract = spec.message.launch_specification.environment
    service = contract.get(env.HELM_CHART_INFERENCE_SERVICE_NAME, "")
    pod = manifests.instance_pod(
        spec,
        attrs.evolve(settings, namespace=ns),
        cluster_group="",
        owner=None,
        pull_secrets=pull_secrets,
        ready_timeout=ready_timeout,
        worker_only=True,
        telemetry_proxy=telemetry_proxy,
    )
    utils = pod["spec"]["containers"][0]
    extra = {
        env.INFERENCE_HOST: f"{service}.{ns}.svc.cluster.local",
        "HELM_CHART_NAMESPACE": ns,
    }
    utils["env"] = [e for e in utils["env"] if e["name"] not in extra] + [
        {"name": k, "value": v} for k, v in extra.items()
    ]
    return pod


def _merge_env(container: dict[str, Any], values: Sequence[Manifest]) -> None:
    have = {e.get("name") for e in container.get("env") or ()}
    container["env"] = list(container.get("env") or ()) + [e for e in values if e["name"] not in have]


def mutate(
    obj: Manifest,
    spec: LaunchSpec,
    settings: KubernetesSettings,
    *,
    pull_secrets: Sequence[str],
    attributes: tuple[str, ...],
) -> Manifest:
    """One chart object as NVCA's webhook admits it: labelled, and its pods placed, pulled and identified."""
    out = copy.deepcopy(obj)
    ns = namespace_of(spec)
    meta = out.setdefault("metadata", {})
    meta["namespace"] = ns
    meta.setdefault("labels", {}).update(labels(spec))
    pod = pod_spec(out)
    if pod is None:
        return out
    template_meta = pod_template_metadata(out)
    if template_meta is not None:
        template_meta.setdefault("labels", {}).update(labels(spec))
    identity = [
        {"name": env.NVCF_INSTANCE_ID, "value": spec.instance_id},
        {"name": env.INSTANCE_ID, "value": spec.instance_id},
        {"name": env.NVCF_FUNCTION_ID, "value": spec.message.function_details.function_id}
        if spec.message.function_details
        else {
            "name": env.NVCT_TASK_ID,
            "value": spec.message.task_details.task_id if spec.message.task_details else "",
        },
        {"name": env.NVCF_INSTANCETYPE, "value": spec.message.instance_type_name},
    ]
    for container in [*(pod.get("initContainers") or ()), *(pod.get("containers") or ())]:
        _merge_env(container, identity)
    pod["automountServiceAccountToken"] = False
    tolerations = list(pod.get("tolerations") or ())
    for toleration in manifests.tolerations(settings):
        if toleration not in tolerations:
            tolerations.append(toleration)
    pod["tolerations"] = tolerations
    secrets = list(pod.get("imagePullSecrets") or ())
    for name in pull_secrets:
        if {"name": name} not in secrets:
            secrets.append({"name": name})
    if secrets:
        pod["imagePullSecrets"] = secrets
    if settings.scheduler_name:
        pod["schedulerName"] = settings.scheduler_name
    affinity = pod.setdefault("affinity", {})
    affinity["nodeAffinity"] = manifests.affinity(spec.message.instance_type_value)["nodeAffinity"]
    if nvlink.nvlink_enabled(attributes):
        if out.get("kind") == "Pod":
            return nvlink.mutate(out, ns)
        if template_meta is not None:
            mutated = nvlink.mutate({"metadata": template_meta, "spec": pod}, ns)
            template_meta.update(mutated["metadata"])
            pod.clear()
            pod.update(mutated["spec"])
    return out
