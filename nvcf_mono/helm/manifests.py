"""From rendered template text to Kubernetes objects: split, parse, leave out what is never installed, order.

Both renderers end here, so a chart gives the same objects (and the same skipped list) whichever ran.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import yaml

from nvcf_mono.helm.errors import HelmRenderError
from nvcf_mono.helm.model import SkippedObject

HOOK_ANNOTATION = "helm.sh/hook"
CRD_KIND = "CustomResourceDefinition"

_SEPARATOR = re.compile(r"^---[ \t]*$", re.MULTILINE)
_SOURCE = re.compile(r"# Source: (?P<source>\S.*?)[ \t]*$", re.MULTILINE)

# Helm's install order (kinds a cluster needs first come first); other kinds follow, in template order.
INSTALL_ORDER = (
    "PriorityClass", "Namespace", "NetworkPolicy", "ResourceQuota", "LimitRange", "PodSecurityPolicy",
    "PodDisruptionBudget", "ServiceAccount", "Secret", "SecretList", "ConfigMap", "StorageClass",
    "PersistentVolume", "PersistentVolumeClaim", "CustomResourceDefinition", "ClusterRole", "ClusterRoleList",
    "ClusterRoleBinding", "ClusterRoleBindingList", "Role", "RoleList", "RoleBinding", "RoleBindingList",
    "Service", "DaemonSet", "Pod", "ReplicationController", "ReplicaSet", "Deployment", "HorizontalPodAutoscaler",
    "StatefulSet", "Job", "CronJob", "IngressClass", "Ingress", "APIService", "MutatingWebhookConfiguration",
    "ValidatingWebhookConfiguration",
)  # fmt: skip
_RANK = {kind: i for i, kind in enumerate(INSTALL_ORDER)}

NOT_WITH_A_CHART = "CRDs are installed by a cluster's operator, not with a chart"


def documents(source: str, text: str) -> list[tuple[str, str]]:
    """``(source, document)`` for each YAML document of ``text``; a ``# Source:`` comment names its template."""
    out = []
    for doc in _SEPARATOR.split(text):
        found = _SOURCE.match(doc.lstrip())  # helm template starts each document with it
        out.append((found["source"] if found else source, doc))
    return out


def _parse(source: str, doc: str) -> Any:
    try:
        return yaml.safe_load(doc)
    except yaml.YAMLError as err:
        raise HelmRenderError(f"cannot render chart: {source} renders invalid YAML: {_problem(err)}") from err


def _problem(err: yaml.YAMLError) -> str:
    if isinstance(err, yaml.MarkedYAMLError) and err.problem:
        mark = err.problem_mark
        return err.problem + ("" if mark is None else f" (line {mark.line + 1} of the document)")
    return " ".join(str(err).split())


def _identity(data: dict[str, Any]) -> tuple[str | None, str | None]:
    kind = data.get("kind")
    meta = data.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    return (str(kind) if kind else None, str(name) if name else None)


def _why_skipped(data: Any) -> str | None:
    if not isinstance(data, dict):
        return f"not a Kubernetes object (a YAML {type(data).__name__})"
    if not data.get("apiVersion") or not data.get("kind"):
        return "not a Kubernetes object: it has no apiVersion or kind"
    meta = data.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, dict) else None
    if isinstance(annotations, dict) and HOOK_ANNOTATION in annotations:
        return f"a Helm hook ({annotations[HOOK_ANNOTATION]}): hooks are never installed"
    if data["kind"] == CRD_KIND:
        return f"a CustomResourceDefinition: {NOT_WITH_A_CHART}"
    return None


def objects_and_skipped(
    rendered: Iterable[tuple[str, str]],
) -> tuple[tuple[dict[str, Any], ...], tuple[SkippedObject, ...]]:
    """Parse ``(template path, rendered text)`` pairs into installable objects (install order) and the rest."""
    kept: list[tuple[int, str, int, dict[str, Any]]] = []
    skipped: list[SkippedObject] = []
    for template, text in rendered:
        for index, (source, doc) in enumerate(documents(template, text)):
            data = _parse(source, doc)
            if data is None:
                continue  # an empty document (or only comments)
            reason = _why_skipped(data)
            if reason is not None:
                kind, name = _identity(data) if isinstance(data, dict) else (None, None)
                skipped.append(SkippedObject(source=source, kind=kind, name=name, reason=reason))
                continue
            kept.append((_RANK.get(str(data["kind"]), len(_RANK)), source, index, data))
    kept.sort(key=lambda item: item[:3])
    return tuple(item[3] for item in kept), tuple(skipped)


def crds_skipped(crds: Iterable[tuple[str, str]]) -> tuple[SkippedObject, ...]:
    """The objects of a chart's ``crds/`` directories (``(path, text)`` pairs), each as skipped."""
    out = []
    for path, text in crds:
        for source, doc in documents(path, text):
            data = _parse(source, doc)
            if data is None:
                continue
            kind, name = _identity(data) if isinstance(data, dict) else (None, None)
            out.append(
                SkippedObject(
                    source=source,
                    kind=kind,
                    name=name,
                    reason=f"in the chart's crds/ directory: {NOT_WITH_A_CHART}",
                )
            )
    return tuple(out)
