"""What the validator changes so a chart conforms (reference helm-validation §3.5): object metadata
filtered, pod specs stripped of placement and privileges, controller and Service selectors replaced
by generated labels (so a chart's pods cannot be selected by anything outside it).
"""

from __future__ import annotations

import copy
import hashlib
import random
from collections.abc import Sequence
from typing import Any

import attrs

from nvcf_mono.reval.objects import CONTROLLER_KINDS, Obj, pod_spec, pod_template_metadata
from nvcf_mono.reval.rules import selects


@attrs.frozen(kw_only=True)
class SanitizeSettings:
    """Which label and annotation keys survive (e.g. apps.kubernetes.io/pod-index), and whether metadata is touched."""

    preserve_labels: tuple[str, ...] = ("apps.kubernetes.io/pod-index",)
    preserve_annotations: tuple[str, ...] = ("dra.nvcf.nvidia.io/required-nvlink-domain-index",)
    skip_metadata: bool = False


def _filter_metadata(meta: dict[str, Any], settings: SanitizeSettings) -> None:
    for key, keep in (("labels", settings.preserve_labels), ("annotations", settings.preserve_annotations)):
        values = meta.get(key)
        if isinstance(values, dict):
            kept = {k: v for k, v in values.items() if k in keep}
            if kept:
                meta[key] = kept
            else:
                meta.pop(key, None)
    meta.pop("ownerReferences", None)


def _sanitize_pod(spec: dict[str, Any]) -> None:
    affinity = spec.get("affinity")
    if isinstance(affinity, dict):
        affinity.pop("nodeAffinity", None)
        if not affinity:
            spec.pop("affinity", None)
    for key in ("nodeSelector", "nodeName", "serviceAccountName", "priorityClassName"):
        spec.pop(key, None)
    spec.setdefault("automountServiceAccountToken", False)
    for container in [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]:
        sc = container.get("securityContext")
        if not sc:
            continue
        adds = (sc.get("capabilities") or {}).get("add") or ()
        if "allowPrivilegeEscalation" not in sc and not sc.get("privileged") and "CAP_SYS_ADMIN" not in adds:
            sc["allowPrivilegeEscalation"] = False


def _token(rng: random.Random) -> str:
    return f"x{rng.randrange(10**9)}x"


def sanitize(objects: Sequence[Obj], settings: SanitizeSettings, rng: random.Random | None = None) -> list[Obj]:
    """The sanitized copies of ``objects`` (in the same order)."""
    rng = rng or random.Random()
    originals = [copy.deepcopy(o) for o in objects]
    out = [copy.deepcopy(o) for o in objects]
    for obj in out:
        if not settings.skip_metadata and isinstance(obj.get("metadata"), dict):
            _filter_metadata(obj["metadata"], settings)
        spec = pod_spec(obj)
        if spec is not None:
            _sanitize_pod(spec)
            template_meta = pod_template_metadata(obj)
            if template_meta is not None and not settings.skip_metadata and obj.get("kind") != "Pod":
                _filter_metadata(template_meta, settings)
    if settings.skip_metadata:
        return out
    for obj in out:
        kind = obj.get("kind")
        spec = obj.get("spec")
        if not isinstance(spec, dict):
            continue
        if kind in CONTROLLER_KINDS:
            label = {"autogen-label-controller": _token(rng)}
            spec["selector"] = {"matchLabels": dict(label)}
            meta = pod_template_metadata(obj)
            if meta is not None:
                meta["labels"] = dict(label)
        elif kind == "CronJob":
            job = (spec.get("jobTemplate") or {}).get("spec")
            if isinstance(job, dict):
                job.pop("selector", None)
                job.pop("manualSelector", None)
                meta = pod_template_metadata(obj)
                if meta is not None:
                    meta.pop("labels", None)
    services = sorted(
        (i for i, o in enumerate(out) if o.get("kind") == "Service"),
        key=lambda i: (out[i].get("metadata", {}).get("name", ""), out[i].get("apiVersion", "")),
    )
    loads = [(i, o) for i, o in enumerate(originals) if pod_spec(o) is not None]
    for i in services:
        service = out[i]
        original_selector = dict((originals[i].get("spec") or {}).get("selector") or {})
        spec = service.setdefault("spec", {})
        kept = {k: v for k, v in original_selector.items() if k in settings.preserve_labels}
        name = service.get("metadata", {}).get("name", "")
        key = "autogen-label-service-" + hashlib.sha256(name.encode()).hexdigest()[:10]
        value = _token(rng)
        spec["selector"] = {**kept, key: value}
        for j, original in loads:
            if selects(original_selector, original):
                meta = pod_template_metadata(out[j])
                if meta is not None:
                    meta.setdefault("labels", {})[key] = value
    return out
