"""The validator's rules on objects, with NVCF's texts (reference helm-validation §3.4-§3.6, §6)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from nvcf_mono.reval.inputs import chart_url_errors, is_private_ip
from nvcf_mono.reval.objects import ExtraType, decode_errors, unsupported_types
from nvcf_mono.reval.rules import object_errors, pod_errors, target_service_errors
from nvcf_mono.reval.sanitize import SanitizeSettings, sanitize

GOOD_SC = {
    "capabilities": {"drop": ["ALL"]},
    "readOnlyRootFilesystem": True,
    "runAsNonRoot": True,
    "runAsUser": 1001,
    "seccompProfile": {"type": "RuntimeDefault"},
    "seLinuxOptions": {"type": "container_kvm_t"},
    "appArmorProfile": {"type": "RuntimeDefault"},
}


def test_every_security_rule_has_its_text() -> None:
    bad_sc = {
        "capabilities": {"add": ["CAP_SYS_ADMIN"]},
        "privileged": True,
        "allowPrivilegeEscalation": True,
        "procMount": "Unmasked",
        "readOnlyRootFilesystem": False,
    }
    spec = {
        "hostNetwork": True,
        "hostPID": True,
        "hostIPC": True,
        "automountServiceAccountToken": True,
        "securityContext": {
            "runAsUser": 0,
            "runAsNonRoot": False,
            "seccompProfile": {"type": "Unconfined"},
            "appArmorProfile": {"type": "Unconfined"},
            "seLinuxOptions": {"type": "container_admin_t", "user": "admin", "role": "admin"},
        },
        "initContainers": [{"name": "badinit1", "image": "x", "securityContext": bad_sc}],
        "containers": [
            {"name": "bad1", "image": "x", "securityContext": bad_sc},
            {"name": "bad2", "image": "x", "securityContext": {}},
            {"name": "good1", "image": "x", "securityContext": GOOD_SC},
        ],
    }
    hard, security = pod_errors(spec)
    assert sorted(hard) == [
        "automountServiceAccountToken must be false",
        "hostIPC must be false",
        "hostNetwork must be false",
        "hostPID must be false",
    ]
    by = {
        name: [e for e in security if e.startswith(name)]
        for name in ('initContainers["badinit1"]', 'containers["bad1"]', 'containers["bad2"]', 'containers["good1"]')
    }
    assert [len(v) for v in by.values()] == [13, 13, 9, 0]
    assert 'containers["bad1"].securityContext.capabilities.drop must contain "ALL"' in security
    assert 'containers["bad1"].securityContext.privileged must not be true' in security
    assert (
        'containers["bad2"].securityContext.capabilities must be set to drop=["ALL"] and optionally '
        'add=["NET_BIND_SERVICE"]' in security
    )
    assert 'containers["bad2"].securityContext.runAsUser or podSpec.securityContext.runAsUser must not be 0' in security


def test_volumes_and_host_ports() -> None:
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "c",
                "image": "x",
                "securityContext": GOOD_SC,
                "ports": [{"name": "web", "containerPort": 80, "hostPort": 80}],
            }
        ],
        "volumes": [
            {"name": "ok-secret", "secret": {"secretName": "s"}},
            {
                "name": "ok-projected",
                "projected": {"sources": [{"secret": {"name": "s"}}, {"configMap": {"name": "c"}}]},
            },
            {"name": "host", "hostPath": {"path": "/"}},
            {"name": "token", "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}},
        ],
    }
    hard, security = pod_errors(spec)
    assert security == []
    assert sorted(hard) == [
        'host ports not allowed: ["web"]',
        'volumes not of allowed types ["emptyDir" "configMap" "projected.sources[*].configMap" "secret" '
        '"projected.sources[*].secret" "persistentVolumeClaim"]: ["host" "token"]',
    ]


def test_kinds() -> None:
    hpa = {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": "h"}}
    ingress = {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": {"name": "i"}}
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "r"}}
    assert unsupported_types([role]) is None
    assert (
        unsupported_types([hpa, ingress, hpa])
        == 'unsupported types: ["autoscaling/v2.HorizontalPodAutoscaler" "networking.k8s.io/v1.Ingress"]'
    )
    assert (
        unsupported_types([hpa], [ExtraType(group="autoscaling", version="v2", kind="HorizontalPodAutoscaler")]) is None
    )
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}, "spec": {"type": "NodePort"}}
    assert object_errors([svc]) == (["service is not ClusterIP"], [])


def test_decoding_limits() -> None:
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}
    assert decode_errors([cm] * 301) == ["rendered chart contains more objects than the maximum allowed 300"]
    assert decode_errors([cm, {"apiVersion": "v1", "kind": "Pod", "metadata": {}}]) == [
        "object 1 is missing required field metadata.name"
    ]


@pytest.mark.parametrize(
    ("url", "errors"),
    [
        ("https://foo.bar", []),
        ("oci://foo.bar/a:b", []),
        ("https://1.2.3.4/chart", []),
        ("http://foo.bar", ["helm chart URL must use https or oci scheme, got 'http'"]),
        ("", ["helm chart URL must use https or oci scheme, got ''", "helm chart URL must have a host"]),
        ("https://:443/chart", ["helm chart URL must have a host"]),
        ("https://10.0.0.1/c", ["helm chart URL must not point to private networks"]),
        ("https://169.254.169.254/c", ["helm chart URL must not point to private networks"]),
        ("https://[fe80::1%25eth0]/c", ["helm chart URL must not point to private networks"]),
    ],
)
def test_chart_urls(url: str, errors: list[str]) -> None:
    assert chart_url_errors(url) == errors


@pytest.mark.parametrize(
    ("address", "private"),
    [
        ("10.0.0.1", True),
        ("172.31.255.255", True),
        ("100.64.0.1", True),
        ("::", True),
        ("fd00::1", True),
        ("fe80::1%eth0", True),
        ("1.2.3.4", False),
        ("172.32.0.0", False),
        ("2001:db8::1", False),
        ("example.com", False),
    ],
)
def test_private_addresses(address: str, private: bool) -> None:
    assert is_private_ip(address) is private


def _deploy(name: str, labels: dict[str, str], port: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": {"team": "a"}},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": {"x": "y"},
                    "serviceAccountName": "root",
                    "containers": [
                        {"name": "c", "image": "i", "ports": [port], "securityContext": {"privileged": False}}
                    ],
                },
            },
        },
    }


def _service(name: str, selector: dict[str, str], port: int, target: Any = None) -> dict[str, Any]:
    p: dict[str, Any] = {"port": port}
    if target is not None:
        p["targetPort"] = target
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {"selector": selector, "ports": [p]},
    }


def test_the_target_service_must_exist_have_the_port_and_reach_a_pod() -> None:
    objs = [
        _deploy("d", {"app": "a"}, {"name": "http", "containerPort": 8000}),
        _service("svc", {"app": "a"}, 9000, "http"),
    ]
    assert target_service_errors(objs, "svc", 9000) == []
    assert target_service_errors(objs, "other", 9000) == ['helm chart service "other" not found']
    assert target_service_errors(objs, "svc", 8000) == ['helm chart service "svc" has no port 8000']
    unmatched = [objs[0], _service("svc", {"app": "b"}, 9000, "http")]
    assert target_service_errors(unmatched, "svc", 9000) == [
        'provided helm chart service "svc" has no port 9000 matching selected pod specs'
    ]
    by_number = [_deploy("d", {"app": "a"}, {"containerPort": 8000}), _service("svc", {"app": "a"}, 8000)]
    assert target_service_errors(by_number, "svc", 8000) == []


def test_sanitizing_replaces_selectors_and_strips_placement() -> None:
    objs = [_deploy("d", {"app": "a"}, {"containerPort": 80}), _service("svc", {"app": "a"}, 80)]
    rng = random.Random(0)
    out = sanitize(objs, SanitizeSettings(), rng)
    deploy, service = out
    assert "labels" not in deploy["metadata"]
    pod = deploy["spec"]["template"]["spec"]
    assert "nodeSelector" not in pod and "serviceAccountName" not in pod
    assert pod["automountServiceAccountToken"] is False
    assert pod["containers"][0]["securityContext"]["allowPrivilegeEscalation"] is False
    (controller_key,) = deploy["spec"]["selector"]["matchLabels"]
    assert controller_key == "autogen-label-controller"
    (service_key,) = service["spec"]["selector"]
    assert service_key.startswith("autogen-label-service-")
    labels = deploy["spec"]["template"]["metadata"]["labels"]
    assert labels[service_key] == service["spec"]["selector"][service_key]
    assert set(labels) == {"autogen-label-controller", service_key}
    assert objs[0]["spec"]["selector"] == {"matchLabels": {"app": "a"}}  # inputs untouched


def test_chart_credentials_come_from_the_auth_config_of_the_charts_host() -> None:
    import base64

    from nvcf_mono.reval.engine import credentials_for

    def auth(text: str) -> dict[str, str]:
        return {"auth": base64.b64encode(text.encode()).decode()}

    config = {"k8sSecrets": [{"auths": {"https://charts.example.com/": auth("robot:pw"), "other.io": auth("x:y")}}]}
    (found,) = credentials_for(config, "oci://charts.example.com/acme/charts/c-1.0.0.tgz").items()
    assert found[0] == "charts.example.com" and [(c.username, c.password) for c in found[1]] == [("robot", "pw")]
    # ReVal's order: a legacy NGC key on an NGC host, then each secret naming the host.
    ngc = "https://helm.ngc.nvidia.com/acme/charts/c-1.0.0.tgz"
    two = {
        "k8sSecrets": [{"auths": {"helm.ngc.nvidia.com": auth("a:1")}}, {"auths": {"helm.ngc.nvidia.com": auth("b:2")}}]
    }
    (tried,) = credentials_for(two, ngc, "nvapi-KEY").values()
    assert [(c.username, c.password) for c in tried] == [("$oauthtoken", "nvapi-KEY"), ("a", "1"), ("b", "2")]
    assert credentials_for(None, "oci://charts.example.com/c", "nvapi-KEY") == {}  # not an NGC host
    assert credentials_for(config, "https://nothing.example.com/c.tgz") == {}
    assert (
        credentials_for(
            {"k8sSecrets": [{"auths": {"charts.example.com": auth("no-colon")}}]}, "oci://charts.example.com/c"
        )
        == {}
    )
    assert credentials_for("not a mapping", "oci://charts.example.com/c") == {}
