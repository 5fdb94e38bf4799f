"""deploy/crds: valid CustomResourceDefinitions, of the names and shapes the compute agent uses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from nvcf_mono.config.load import ConfigSources, load_config

ROOT = Path(__file__).resolve().parents[2]
CRDS = ROOT / "deploy" / "crds"
KUBERNETES = kubernetes_validate.latest_version()


def _crds() -> dict[str, dict[str, Any]]:
    return {path.name: yaml.safe_load(path.read_text()) for path in sorted(CRDS.glob("*.yaml"))}


def _crd(kind: str) -> dict[str, Any]:
    return next(crd for crd in _crds().values() if crd["spec"]["names"]["kind"] == kind)


@pytest.mark.parametrize("name", sorted(_crds()))
def test_each_crd_is_a_valid_customresourcedefinition(name: str) -> None:
    crd = _crds()[name]
    kubernetes_validate.validate(crd, KUBERNETES, strict=True)
    spec = crd["spec"]
    assert name == f"{crd['metadata']['name']}.yaml"
    assert crd["metadata"]["name"] == f"{spec['names']['plural']}.{spec['group']}"
    (version,) = spec["versions"]
    assert version["served"] and version["storage"]
    assert _structural_problems(version["schema"]["openAPIV3Schema"], "openAPIV3Schema") == []
    columns = [c["jsonPath"] for c in version["additionalPrinterColumns"]]
    assert ".metadata.creationTimestamp" in columns


def _structural_problems(node: dict[str, Any], path: str) -> list[str]:
    """What the API server refuses in a schema: a node without a type (unless it is free-form)."""
    problems = []
    free = node.get("x-kubernetes-preserve-unknown-fields") or node.get("x-kubernetes-int-or-string")
    if "type" not in node and not free:
        problems.append(f"{path}: no type")
    for key, child in (node.get("properties") or {}).items():
        problems += _structural_problems(child, f"{path}.{key}")
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            problems += _structural_problems(node[key], f"{path}[{key}]")
    return problems


@pytest.mark.parametrize(
    ("kind", "group", "version", "scope", "plural", "short_names"),
    [
        ("ICMSRequest", "nvca.nvcf.nvidia.io", "v2beta1", "Namespaced", "icmsrequests", ["ir"]),
        ("MiniService", "nvca.nvcf.nvidia.io", "v1alpha1", "Cluster", "miniservices", None),
        ("NVCFBackend", "nvcf.nvidia.io", "v1", "Namespaced", "nvcfbackends", None),
    ],
)
def test_names_scope_and_status_subresource(
    kind: str, group: str, version: str, scope: str, plural: str, short_names: list[str] | None
) -> None:
    spec = _crd(kind)["spec"]
    assert (spec["group"], spec["scope"], spec["names"]["plural"]) == (group, scope, plural)
    assert spec["names"].get("shortNames") == short_names
    (served,) = spec["versions"]
    assert served["name"] == version
    assert served["subresources"] == {"status": {}}


def _pruning(node: dict[str, Any]) -> dict[str, Any]:
    """The schema as the API server applies it: fields it does not know are dropped (here: refused)."""
    out = dict(node)
    if "properties" in node:
        out["properties"] = {k: _pruning(v) for k, v in node["properties"].items()}
        if not node.get("x-kubernetes-preserve-unknown-fields") and "additionalProperties" not in node:
            out["additionalProperties"] = False
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            out[key] = _pruning(node[key])
    return out


def _icms_validator() -> jsonschema.Validator:
    (version,) = _crd("ICMSRequest")["spec"]["versions"]
    schema = _pruning(version["schema"]["openAPIV3Schema"])
    return jsonschema.Draft4Validator(schema, format_checker=jsonschema.FormatChecker())


def test_the_icmsrequests_the_agent_writes_keep_every_field() -> None:
    # The Kubernetes backend's own golden manifests: nothing it writes may be pruned by the CRD.
    golden = sorted((ROOT / "tests" / "unit" / "compute" / "golden").glob("*.yaml"))
    requests = [
        doc for path in golden for doc in yaml.safe_load_all(path.read_text()) if doc and doc["kind"] == "ICMSRequest"
    ]
    assert requests, "no ICMSRequest among the Kubernetes backend's golden manifests"
    validator = _icms_validator()
    for request in requests:
        assert [e.message for e in validator.iter_errors(request)] == []
    status = {
        "requestStatus": "RequestInstancesInProgress",
        "lastStatusUpdated": "2026-01-01T00:00:00Z",
        "instances": {
            "i-1": {
                "id": "i-1",
                "instanceType": "Pod",
                "status": "STARTING",
                "lastReportedStatus": "STARTING",
                "lastReportedTimestamp": "2026-01-01T00:00:00Z",
            }
        },
    }
    assert [e.message for e in validator.iter_errors({**requests[0], "status": status})] == []
    wrong = {**requests[0], "spec": {**requests[0]["spec"], "requestId": 7}}
    assert [e.message for e in validator.iter_errors(wrong)] == ["7 is not of type 'string'"]


def test_the_images_default_config_is_valid() -> None:
    config = load_config(ConfigSources(files=(ROOT / "deploy" / "docker" / "nvcf-mono.yaml",)))
    assert config.settings.role == "all-in-one"
    assert (config.settings.http.host, config.settings.http.port) == ("0.0.0.0", 8080)
    assert (config.settings.grpc.host, config.settings.grpc.port) == ("0.0.0.0", 8081)


def test_the_image_runs_the_config_file_it_ships() -> None:
    lines = (ROOT / "Dockerfile").read_text().splitlines()
    copy = next(line.split() for line in lines if line.startswith("COPY") and "deploy/docker/nvcf-mono.yaml" in line)
    cmd = json.loads(next(line for line in lines if line.startswith("CMD ")).removeprefix("CMD "))
    assert cmd == ["run", "--config", copy[-1]]
    assert json.loads(next(line for line in lines if line.startswith("ENTRYPOINT ")).removeprefix("ENTRYPOINT ")) == [
        "nvcf-mono"
    ]
    # The build context (.dockerignore) holds what `pip install` and that COPY need.
    kept = {line for line in (ROOT / ".dockerignore").read_text().splitlines() if line.startswith("!")}
    assert kept >= {"!pyproject.toml", "!README.md", "!nvcf_mono/", "!deploy/docker/"}
