"""Rendered objects: decoding limits, the allowed kinds, and where each kind keeps its pod spec."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import attrs

Obj = dict[str, Any]

MAX_OBJECTS = 300
#: Per rendered document: 1 MiB plus 1 KiB of metadata.
MAX_OBJECT_BYTES = 1024 * 1024 + 1024

#: (group, version, kind) allowed in every chart ("" is the core group) -> its resource (plural).
ALLOWED: Mapping[tuple[str, str, str], str] = {
    ("", "v1", "Pod"): "pods",
    ("apps", "v1", "Deployment"): "deployments",
    ("apps", "v1", "ReplicaSet"): "replicasets",
    ("apps", "v1", "StatefulSet"): "statefulsets",
    ("batch", "v1", "Job"): "jobs",
    ("batch", "v1", "CronJob"): "cronjobs",
    ("", "v1", "Service"): "services",
    ("", "v1", "ConfigMap"): "configmaps",
    ("", "v1", "Secret"): "secrets",
    ("", "v1", "PersistentVolumeClaim"): "persistentvolumeclaims",
}
#: Tolerated for older charts; they will be refused one day.
DEPRECATED: Mapping[tuple[str, str, str], str] = {
    ("", "v1", "ServiceAccount"): "serviceaccounts",
    ("rbac.authorization.k8s.io", "v1", "RoleBinding"): "rolebindings",
    ("rbac.authorization.k8s.io", "v1", "Role"): "roles",
}
WORKLOAD_KINDS = ("Pod", "Deployment", "ReplicaSet", "StatefulSet", "Job", "CronJob")
CONTROLLER_KINDS = ("Deployment", "ReplicaSet", "StatefulSet")


@attrs.frozen(kw_only=True)
class ExtraType:
    """A further kind a validation policy allows: ``group``/``version``/``kind`` (and its ``resource``)."""

    group: str
    version: str
    kind: str
    resource: str = ""


def gvk(obj: Mapping[str, Any]) -> tuple[str, str, str]:
    api_version = str(obj.get("apiVersion", ""))
    group, _, version = api_version.rpartition("/")
    return group, version, str(obj.get("kind", ""))


def type_name(obj: Mapping[str, Any]) -> str:
    """``<group>/<version>.<Kind>`` with ``core`` for the core group (NVCF's spelling in errors)."""
    group, version, kind = gvk(obj)
    return f"{group or 'core'}/{version}.{kind}"


def decode_errors(objects: Sequence[Mapping[str, Any]]) -> list[str]:
    """The decoder's refusals: too many objects, one too large, one that is not a named object."""
    if len(objects) > MAX_OBJECTS:
        return [f"rendered chart contains more objects than the maximum allowed {MAX_OBJECTS}"]
    errors = []
    for i, obj in enumerate(objects):
        size = len(json.dumps(obj, separators=(",", ":")).encode())
        if size > MAX_OBJECT_BYTES:
            return [
                f"size of object at index {i} is larger than maximum {MAX_OBJECT_BYTES} bytes "
                "(including object metadata)"
            ]
        meta = obj.get("metadata")
        if not isinstance(meta, dict):
            errors.append(f"object {i} is not a valid Kubernetes type ({type_name(obj)})")
        elif not meta.get("name"):
            errors.append(f"object {i} is missing required field metadata.name")
    return errors


def unsupported_types(objects: Iterable[Mapping[str, Any]], extras: Iterable[ExtraType] = ()) -> str | None:
    """``unsupported types: ["autoscaling/v2.HorizontalPodAutoscaler" ...]``, or None when every kind is allowed."""
    allowed = {*ALLOWED, *DEPRECATED} | {(e.group, e.version, e.kind) for e in extras}
    bad: list[str] = []
    for obj in objects:
        if gvk(obj) not in allowed:
            name = type_name(obj)
            if name not in bad:
                bad.append(name)
    if not bad:
        return None
    return "unsupported types: [" + " ".join(json.dumps(b) for b in bad) + "]"


def pod_spec(obj: Mapping[str, Any]) -> Obj | None:
    """The pod spec of a workload object (a Pod's own, a controller's template's), or None."""
    kind = obj.get("kind")
    spec = obj.get("spec")
    if not isinstance(spec, dict) or kind not in WORKLOAD_KINDS:
        return None
    if kind == "Pod":
        return spec
    if kind == "CronJob":
        spec = ((spec.get("jobTemplate") or {}).get("spec")) or {}
    template = spec.get("template") if isinstance(spec, dict) else None
    inner = template.get("spec") if isinstance(template, dict) else None
    return inner if isinstance(inner, dict) else None


def pod_template_metadata(obj: Mapping[str, Any]) -> Obj | None:
    """Where a workload's pods get their labels and annotations (the Pod's own metadata for a Pod)."""
    kind = obj.get("kind")
    if kind == "Pod":
        meta = obj.get("metadata")
        return meta if isinstance(meta, dict) else None
    spec = obj.get("spec")
    if not isinstance(spec, dict) or kind not in WORKLOAD_KINDS:
        return None
    if kind == "CronJob":
        spec = ((spec.get("jobTemplate") or {}).get("spec")) or {}
    template = spec.get("template")
    if not isinstance(template, dict):
        return None
    meta = template.setdefault("metadata", {})
    return meta if isinstance(meta, dict) else None


def workloads(objects: Iterable[Obj]) -> Iterator[Obj]:
    for obj in objects:
        if obj.get("kind") in WORKLOAD_KINDS and pod_spec(obj) is not None:
            yield obj
