"""The rules every rendered object must follow (reference helm-validation §3.6), with NVCF's error texts.

Security-context rules can be enforced or only reported (NVCF documents them as "not enforced yet");
the others always are.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from nvcf_mono.reval.objects import Obj, pod_spec, pod_template_metadata, workloads

_ALLOWED_VOLUMES = (
    '["emptyDir" "configMap" "projected.sources[*].configMap" "secret" "projected.sources[*].secret" '
    '"persistentVolumeClaim"]'
)
_PLAIN_VOLUMES = ("emptyDir", "configMap", "secret", "persistentVolumeClaim")
_SELINUX_TYPES = ("", "container_t", "container_init_t", "container_kvm_t", "container_engine_t")
_INHERITED = ("runAsUser", "runAsNonRoot", "seccompProfile", "appArmorProfile", "seLinuxOptions")


def _quoted(items: Iterable[str]) -> str:
    return "[" + " ".join(json.dumps(i) for i in items) + "]"


def _effective(container: Mapping[str, Any], pod: Mapping[str, Any]) -> dict[str, Any]:
    """The container's security context, with what it leaves unset taken from the pod's."""
    own = dict(container.get("securityContext") or {})
    pod_sc = pod.get("securityContext") or {}
    for key in _INHERITED:
        if own.get(key) is None and pod_sc.get(key) is not None:
            own[key] = pod_sc[key]
    return own


def container_security_errors(prefix: str, sc: Mapping[str, Any]) -> list[str]:
    """One container's security-context problems (``prefix``: ``containers["name"]``)."""
    p = f"{prefix}.securityContext"
    errors = []
    caps = sc.get("capabilities")
    if caps is None:
        errors.append(f'{p}.capabilities must be set to drop=["ALL"] and optionally add=["NET_BIND_SERVICE"]')
    else:
        if not any(str(d).upper() == "ALL" for d in caps.get("drop") or ()):
            errors.append(f'{p}.capabilities.drop must contain "ALL"')
        add = list(caps.get("add") or ())
        if add and add != ["NET_BIND_SERVICE"]:
            errors.append(f'{p}.capabilities.add must be unset or set to ["NET_BIND_SERVICE"]')
    if sc.get("privileged") is True:
        errors.append(f"{p}.privileged must not be true")
    if sc.get("allowPrivilegeEscalation") is True:
        errors.append(f"{p}.allowPrivilegeEscalation must not be true")
    if sc.get("procMount") not in (None, "Default"):
        errors.append(f"{p}.procMount must be unset or set to Default")
    if sc.get("readOnlyRootFilesystem") is not True:
        errors.append(f"{p}.readOnlyRootFilesystem must be set to true")
    if sc.get("runAsUser") == 0:
        errors.append(f"{p}.runAsUser or podSpec.securityContext.runAsUser must not be 0")
    if sc.get("runAsNonRoot") is not True:
        errors.append(f"{p}.runAsNonRoot or podSpec.securityContext.runAsNonRoot must be set to true")
    seccomp = sc.get("seccompProfile")
    if seccomp is None:
        errors.append(f"{p}.seccompProfile or podSpec.securityContext.seccompProfile must have type=RuntimeDefault")
    elif seccomp.get("type") not in ("RuntimeDefault", "Localhost"):
        errors.append(
            f"{p}.seccompProfile.type or podSpec.securityContext.seccompProfile.type must be set to one of "
            "RuntimeDefault/Localhost"
        )
    apparmor = sc.get("appArmorProfile")
    if apparmor is not None and apparmor.get("type") not in ("", None, "RuntimeDefault", "Localhost"):
        errors.append(
            f"{p}.appArmorProfile.type or podSpec.securityContext.appArmorProfile.type must be set to one of "
            '""/RuntimeDefault/Localhost'
        )
    selinux = sc.get("seLinuxOptions")
    if selinux is not None:
        if (selinux.get("type") or "") not in _SELINUX_TYPES:
            errors.append(
                f"{p}.seLinuxOptions.type or podSpec.securityContext.seLinuxOptions.type must be set to one of "
                '""/container_t/container_init_t/container_kvm_t/container_engine_t'
            )
        if selinux.get("user"):
            errors.append(f"{p}.seLinuxOptions.user or podSpec.securityContext.seLinuxOptions.user must be unset")
        if selinux.get("role"):
            errors.append(f"{p}.seLinuxOptions.role or podSpec.securityContext.seLinuxOptions.role must be unset")
    return errors


def pod_errors(spec: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """(errors always enforced, security-context errors) of one pod spec."""
    hard: list[str] = []
    security: list[str] = []
    containers = [("initContainers", c) for c in spec.get("initContainers") or ()] + [
        ("containers", c) for c in spec.get("containers") or ()
    ]
    for _, c in containers:
        if not str(c.get("image") or "").strip():
            hard.append(f'container "{c.get("name", "")}" has no image')
    for flag in ("hostIPC", "hostNetwork", "hostPID"):
        if spec.get(flag) is True:
            hard.append(f"{flag} must be false")
    if spec.get("automountServiceAccountToken") is True:
        hard.append("automountServiceAccountToken must be false")
    for key, c in containers:
        prefix = f'{key}["{c.get("name", "")}"]'
        host_ports = [str(p.get("name") or p.get("hostPort")) for p in c.get("ports") or () if p.get("hostPort")]
        if host_ports:
            hard.append(f"host ports not allowed: {_quoted(host_ports)}")
        security += container_security_errors(prefix, _effective(c, spec))
    bad_volumes = [str(v.get("name", "")) for v in spec.get("volumes") or () if not _volume_allowed(v)]
    if bad_volumes:
        hard.append(f"volumes not of allowed types {_ALLOWED_VOLUMES}: {_quoted(bad_volumes)}")
    return hard, security


def _volume_allowed(volume: Mapping[str, Any]) -> bool:
    sources = [k for k in volume if k != "name"]
    if len(sources) != 1:
        return False
    (source,) = sources
    if source in _PLAIN_VOLUMES:
        return True
    if source == "projected":
        parts = (volume.get("projected") or {}).get("sources") or ()
        return all(set(part) <= {"configMap", "secret"} and part for part in parts)
    return False


def _labels(meta: Mapping[str, Any] | None) -> dict[str, str]:
    return dict((meta or {}).get("labels") or {})


def selects(selector: Mapping[str, str], workload: Mapping[str, Any]) -> bool:
    """A Service's selector matches a workload's pod labels (``pod-index`` restricts to StatefulSets)."""
    wanted = dict(selector)
    if wanted.pop("apps.kubernetes.io/pod-index", "") and workload.get("kind") != "StatefulSet":
        return False
    labels = _labels(pod_template_metadata(dict(workload)))
    return all(labels.get(k) == v for k, v in wanted.items())


def _container_ports(spec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [p for c in spec.get("containers") or () for p in c.get("ports") or ()]


def target_service_errors(originals: Sequence[Obj], service_name: str, service_port: int) -> list[str]:
    """The target Service exists, has the port, and some pod it selects listens on its targetPort."""
    service = next(
        (o for o in originals if o.get("kind") == "Service" and o.get("metadata", {}).get("name") == service_name),
        None,
    )
    if service is None:
        return [f'helm chart service "{service_name}" not found']
    spec = service.get("spec") or {}
    port = next((p for p in spec.get("ports") or () if p.get("port") == service_port), None)
    if port is None:
        return [f'helm chart service "{service_name}" has no port {service_port}']
    target = port.get("targetPort", service_port)
    selector = spec.get("selector") or {}
    for workload in workloads(originals):
        if not selects(selector, workload):
            continue
        pod = pod_spec(workload) or {}
        for cp in _container_ports(pod):
            if isinstance(target, str) and not target.isdigit():
                if cp.get("name") == target:
                    return []
            elif cp.get("containerPort") == int(target):
                return []
    return [f'provided helm chart service "{service_name}" has no port {service_port} matching selected pod specs']


def object_errors(objects: Sequence[Obj]) -> tuple[list[str], list[str]]:
    """(errors always enforced, security-context errors) of every object, each list sorted."""
    hard: list[str] = []
    security: list[str] = []
    for obj in objects:
        spec = pod_spec(obj)
        if spec is not None:
            h, s = pod_errors(spec)
            hard += h
            security += s
        if obj.get("kind") == "Service":
            kind = (obj.get("spec") or {}).get("type")
            if kind not in (None, "", "ClusterIP"):
                hard.append("service is not ClusterIP")
    return sorted(hard), sorted(security)
