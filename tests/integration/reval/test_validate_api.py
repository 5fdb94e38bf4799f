"""``/v1/validate`` and ``/v1/render`` with real charts rendered in-process, and the checks at function
creation and deployment. Charts are local directories (``plugins.control.helm.allow_local_charts``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nvcf_mono.testing.running import platform
from tests.function_charts import INFERENCE, SERVICE, VALUES, WORKLOAD_CONFIG, write_chart

LOCAL = {"plugins.control.helm.allow_local_charts": "true"}
VOLUME_ERROR = (
    'volumes not of allowed types ["emptyDir" "configMap" "projected.sources[*].configMap" "secret" '
    '"projected.sources[*].secret" "persistentVolumeClaim"]: ["host"]'
)

HPA = """\
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: hpa}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: inference}
  maxReplicas: 2
"""
HOOK = """\
apiVersion: batch/v1
kind: Job
metadata:
  name: migrate
  annotations: {"helm.sh/hook": pre-install}
spec:
  template:
    spec:
      restartPolicy: Never
      containers: [{name: m, image: busybox, securityContext: {privileged: true}}]
"""
CRD = """\
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.example.com}
spec:
  group: example.com
  names: {kind: Widget, plural: widgets}
  scope: Namespaced
  versions: [{name: v1, served: true, storage: true, schema: {openAPIV3Schema: {type: object}}}]
"""
MANY = """\
{{- range $i := until 301 }}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: "cm-{{ $i }}"}
{{- end }}
"""
HOST_PATH = (
    INFERENCE
    + """\
      volumes:
        - {name: host, hostPath: {path: /var/run}}
"""
)
PRIVILEGED = INFERENCE.replace(
    "            runAsUser: 1000\n", "            runAsUser: 1000\n            privileged: true\n"
)

# name -> (templates, values changes, chart version, valid, errors)
CASES: dict[str, tuple[dict[str, str], dict[str, Any], str, bool, list[str]]] = {
    "the sample": ({"i.yaml": INFERENCE, "s.yaml": SERVICE, "w.yaml": WORKLOAD_CONFIG}, {}, "1.0.0", True, []),
    "forbidden kinds": (
        {"i.yaml": INFERENCE, "s.yaml": SERVICE, "h.yaml": HPA},
        {},
        "1.0.0",
        False,
        ['unsupported types: ["autoscaling/v2.HorizontalPodAutoscaler"]'],
    ),
    "more than 300 objects": (
        {"i.yaml": INFERENCE, "s.yaml": SERVICE, "m.yaml": MANY},
        {},
        "1.0.0",
        False,
        ["rendered chart contains more objects than the maximum allowed 300"],
    ),
    "a hostPath volume": ({"i.yaml": HOST_PATH, "s.yaml": SERVICE}, {}, "1.0.0", False, [VOLUME_ERROR]),
    "a NodePort service": (
        {"i.yaml": INFERENCE, "s.yaml": SERVICE},
        {"serviceType": "NodePort"},
        "1.0.0",
        False,
        ["service is not ClusterIP"],
    ),
    "no target service": (
        {"i.yaml": INFERENCE, "s.yaml": SERVICE},
        {"serviceName": "other"},
        "1.0.0",
        False,
        ['helm chart service "inference-svc" not found'],
    ),
    "a mismatched port": (
        {"i.yaml": INFERENCE, "s.yaml": SERVICE},
        {"servicePort": 9000},
        "1.0.0",
        False,
        ['helm chart service "inference-svc" has no port 8001'],
    ),
    "a hook-annotated job (never rendered)": (
        {"i.yaml": INFERENCE, "s.yaml": SERVICE, "h.yaml": HOOK},
        {},
        "1.0.0",
        True,
        [],
    ),
    "a CRD in templates (skipped)": ({"i.yaml": INFERENCE, "s.yaml": SERVICE, "c.yaml": CRD}, {}, "1.0.0", True, []),
    "a chart version with '-'": (
        {"i.yaml": INFERENCE, "s.yaml": SERVICE},
        {},
        "1.0.0-beta",
        False,
        ["Helm chart version '1.0.0-beta' must not contain '-'"],
    ),
}


def request(chart: Path, **extra: Any) -> dict[str, Any]:
    return {"helmChart": str(chart), "helmChartServiceName": "inference-svc", "helmChartServicePort": 8001, **extra}


async def test_the_reference_verdicts_and_texts(tmp_path: Path) -> None:
    async with platform(tmp_path / "p", **LOCAL) as p:
        for name, (templates, changes, version, valid, errors) in CASES.items():
            chart = write_chart(
                tmp_path / name.replace(" ", "_"), version=version, templates=templates, values={**VALUES, **changes}
            )
            reply = await p.admin.post("/v1/validate", request(chart))
            assert reply.status == 200, (name, reply.body)
            assert (reply.json["valid"], reply.json["validationErrors"]) == (valid, errors), name


@pytest.mark.slow
async def test_security_context_rules_warn_unless_enforced(tmp_path: Path) -> None:
    chart = write_chart(tmp_path, templates={"i.yaml": PRIVILEGED, "s.yaml": SERVICE})
    message = 'containers["server"].securityContext.privileged must not be true'
    async with platform(tmp_path / "warn", **LOCAL) as p:
        reply = await p.admin.post("/v1/validate", request(chart))
        assert reply.json["valid"] is True
        assert reply.json["warnings"] == [message + " (not enforced yet)"]
    async with platform(
        tmp_path / "enforce", **LOCAL, **{"plugins.control.helm.enforce_security_context": "true"}
    ) as p:
        reply = await p.admin.post("/v1/validate", request(chart))
        assert (reply.json["valid"], reply.json["validationErrors"]) == (False, [message])


async def test_render_returns_the_sanitized_objects_and_policies_choose_kinds(tmp_path: Path) -> None:
    chart = write_chart(tmp_path, templates={"i.yaml": INFERENCE, "s.yaml": SERVICE, "h.yaml": HPA})
    async with platform(tmp_path / "p", **LOCAL) as p:
        reply = await p.admin.post("/v1/render", request(chart, configuration={"greeting": "hi"}))
        assert reply.json == {
            "valid": False,
            "validationErrors": ['unsupported types: ["autoscaling/v2.HorizontalPodAutoscaler"]'],
            "output": [],
            "warnings": [],
            "skipped": [],
        }
        extra = {
            "group": "autoscaling",
            "version": "v2",
            "kind": "HorizontalPodAutoscaler",
            "resource": "horizontalpodautoscalers",
        }
        allowed = {"name": "Default", "allowedExtraKubernetesTypes": [extra]}
        reply = await p.admin.post(
            "/v1/render", request(chart, configuration={"greeting": "hi"}, validationPolicy=allowed)
        )
        assert reply.json["valid"] is True, reply.body
        kinds = {o["kind"]: o for o in reply.json["output"]}
        assert set(kinds) == {"Deployment", "Service", "HorizontalPodAutoscaler"}
        container = kinds["Deployment"]["spec"]["template"]["spec"]["containers"][0]
        assert {"name": "GREETING", "value": "hi"} in container["env"]
        assert list(kinds["Deployment"]["spec"]["selector"]["matchLabels"]) == ["autogen-label-controller"]
        policies = [
            {"id": "a", "name": "Default"},
            {"id": "b", "name": "Unrestricted", "allowedExtraKubernetesTypes": [extra]},
        ]
        reply = await p.admin.post("/v1/validate", request(chart, validationPolicies=policies))
        assert reply.json["valid"] is True
        assert reply.json["validationPolicies"] == [
            {
                "id": "a",
                "valid": False,
                "validationErrors": ['unsupported types: ["autoscaling/v2.HorizontalPodAutoscaler"]'],
            },
            {"id": "b", "valid": True, "validationErrors": []},
        ]


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        ({}, "helmChart is required"),
        (
            {"helmChart": "oci://r.example.com/c", "validationPolicies": [{"name": "Default"}]},
            "validation policy 0 is missing ID",
        ),
        (
            {"helmChart": "oci://r.example.com/c", "validationPolicies": [{"id": "x", "name": "Loose"}]},
            "unexpected name 'Loose'",
        ),
    ],
)
async def test_malformed_requests_are_400(tmp_path: Path, body: dict[str, Any], detail: str) -> None:
    async with platform(tmp_path, **LOCAL) as p:
        reply = await p.admin.post("/v1/validate", body)
        assert reply.status == 400 and detail in reply.detail


async def test_urls_are_checked_before_anything_is_fetched(tmp_path: Path) -> None:
    async with platform(tmp_path) as p:
        reply = await p.admin.post("/v1/validate", {"helmChart": "https://10.1.2.3/charts/x-1.0.0.tgz"})
        assert reply.json == {
            "valid": False,
            "validationErrors": ["helm chart URL must not point to private networks"],
            "warnings": [],
            "skipped": [],
        }
        local = await p.admin.post("/v1/validate", {"helmChart": str(tmp_path)})
        assert local.json["validationErrors"] == [
            "helm chart URL must have a host",
            "helm chart URL must use https or oci scheme, got ''",
        ]


async def test_a_chart_is_fetched_only_from_public_addresses_and_the_listed_networks(tmp_path: Path) -> None:
    # A name passes the URL's check; the platform fetching it checks what the name resolves to.
    chart = "https://localhost:9/charts/x-1.0.0.tgz"
    async with platform(tmp_path / "a") as p:
        reply = await p.admin.post("/v1/validate", {"helmChart": chart})
        assert reply.json["valid"] is False, reply.body
        (error,) = reply.json["validationErrors"]
        # Whatever else localhost resolves to (::1 on hosts with IPv6), its IPv4 loopback is named.
        assert f"cannot download chart {chart}: localhost: " in error and "127.0.0.1 is a loopback address" in error
        assert "plugins.helm.chart_networks" in error
        function = {"name": "chart", "inferenceUrl": "/infer", "inferencePort": 8001, "helmChart": chart}
        refused = await p.admin.post("/v2/nvcf/functions", {**function, "helmChartServiceName": "svc"})
        assert refused.status == 400 and "127.0.0.1 is a loopback address" in refused.detail
    # Listed: the platform connects (nothing listens on port 9, and the error says so).
    async with platform(tmp_path / "b", **{"plugins.helm.chart_networks": '["127.0.0.0/8", "::1/128"]'}) as p:
        reply = await p.admin.post("/v1/validate", {"helmChart": chart})
        (error,) = reply.json["validationErrors"]
        assert "cannot connect to localhost:9" in error and "loopback" not in error, error


async def test_function_creation_and_deployment_refuse_an_invalid_chart(tmp_path: Path) -> None:
    good = write_chart(tmp_path / "good", templates={"i.yaml": INFERENCE, "s.yaml": SERVICE})
    bad = write_chart(tmp_path / "bad", templates={"i.yaml": HOST_PATH, "s.yaml": SERVICE})
    function = {
        "name": "chart",
        "inferenceUrl": "/infer",
        "inferencePort": 8001,
        "helmChartServiceName": "inference-svc",
    }
    async with platform(tmp_path / "p", **LOCAL) as p:
        refused = await p.admin.post("/v2/nvcf/functions", {**function, "helmChart": f"file://{bad}"})
        assert refused.status == 400
        assert refused.json["validationErrors"] == [VOLUME_ERROR]
        assert VOLUME_ERROR in refused.detail
        wrong_port = await p.admin.post(
            "/v2/nvcf/functions", {**function, "inferencePort": 8000, "helmChart": f"file://{good}"}
        )
        assert wrong_port.json["validationErrors"] == ['helm chart service "inference-svc" has no port 8000']
        made = await p.admin.post("/v2/nvcf/functions", {**function, "helmChart": f"file://{good}"})
        assert made.status == 200, made.body
        assert made.json["function"]["helmChart"] == f"file://{good}"
