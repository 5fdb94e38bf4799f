"""The exact shape of an instance's Kubernetes objects (golden files), and that they are valid objects.

To accept an intended change: ``UPDATE_GOLDEN=1 pytest tests/unit/compute/test_kube_manifests.py``, then
read the diff of ``tests/unit/compute/golden/``.
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from nvcf_mono.contracts import env, pull_credentials
from nvcf_mono.contracts.messages import Action, CreationMessage, FunctionDetails, LaunchSpecification, TaskDetails
from nvcf_mono.planes.compute.backends import LaunchSpec
from nvcf_mono.planes.compute.backends.kubernetes import manifests
from nvcf_mono.planes.compute.config import KubernetesSettings, Toleration

GOLDEN = Path(__file__).parent / "golden"
REQUEST = "6f1c2d3e-0000-4000-8000-00000000abcd"
SETTINGS = KubernetesSettings(
    worker_image="registry.example.com/nvcf-mono:1.0",
    image_pull_secrets=("platform-pull",),
    tolerations=(Toleration(key="dedicated", operator="Equal", value="gpu", effect="NoSchedule"),),
)
OWNER = {"metadata": {"name": f"sr-{REQUEST}", "uid": "11111111-2222-3333-4444-555555555555"}}
CREDENTIALS = base64.b64encode(
    json.dumps(
        {
            "k8sSecrets": [
                {"auths": {"nvcr.io": {"auth": base64.b64encode(b"$oauthtoken:key").decode()}}},
                {"auths": {"docker.io": {"auth": "b3RoZXI6c2VjcmV0"}}},
            ]
        }
    ).encode()
).decode()


TELEMETRY_AUTH = "Bearer telemetry-token-never-in-the-pod-spec"


def message(*, task: bool = False) -> CreationMessage:
    contract = {
        env.INFERENCE_CONTAINER: "nvcr.io/acme/llm:2.1",
        env.INFERENCE_CONTAINER_ARGS: "--model /models/a --port 9000",
        env.INFERENCE_CONTAINER_ENV: json.dumps([{"key": "LOG_LEVEL", "value": "debug"}]),
        env.INFERENCE_PORT: "9000",
        env.INFERENCE_URL: "/v1/chat",
        env.NVCF_WORKER_TOKEN: "token-never-in-the-pod-spec",
        env.NVCF_FQDN_GRPC: "nvcf-invocation.nvcf:8081",
        env.NCA_ID: "acme",
        env.REGION: "us-west",
        env.BACKEND: "gpu-west",
        env.INSTANCE_TYPE: "ON-PREM.GPU.H100_2x",
        "CONTAINER_REGISTRIES_CREDENTIALS": CREDENTIALS,
    }
    if not task:
        contract[env.NVCF_TELEMETRY_EXPORTS] = json.dumps(
            {"traces": {"url": "https://otel.example.com/v1/traces", "headers": {"Authorization": TELEMETRY_AUTH}}}
        )
    if task:
        contract |= {env.NVCT_TASK_ID: "task-1", env.NVCT_TASK_NAME: "train", env.NVCT_NCA_ID: "acme"}
    return CreationMessage(
        request_id=REQUEST,
        nca_id="acme",
        action=Action.REQUEST_INSTANCES_FOR_TASK if task else Action.REQUEST_INSTANCES,
        cluster_id="cluster-1",
        instance_count=1,
        instance_type_name="ON-PREM.GPU.H100_2x",
        instance_type_value="ON-PREM.GPU.H100",
        gpu_type="H100",
        requested_gpu_count=2,
        message_batch_id=REQUEST,
        created_at="2026-12-03T00:00:00Z",
        deployment_id=None if task else "dep-1",
        gpu_specification_id=None if task else "spec-1",
        function_details=None
        if task
        else FunctionDetails(function_id="fn-1", function_version_id="ver-1", function_name="llm"),
        task_details=TaskDetails(task_id="task-1", task_name="train") if task else None,
        launch_specification=LaunchSpecification(
            gpu_name="H100",
            container_image="nvcr.io/acme/llm:2.1",
            environment=contract,
            max_runtime_duration="PT2H" if task else None,
            max_queued_duration="PT30M" if task else None,
            result_handling_strategy="UPLOAD" if task else None,
        ),
    )


def launch(task: bool = False) -> LaunchSpec:
    return LaunchSpec(
        cluster_id="cluster-1",
        request_id=REQUEST,
        instance_id=f"0-sr-{REQUEST}",
        message=message(task=task),
        allocation=None,
        directory=Path("/unused"),
    )


def objects(task: bool) -> list[dict[str, Any]]:
    spec = launch(task)
    owner = manifests.owner_reference(OWNER)
    regcred = manifests.pull_secret(spec, SETTINGS, owner=owner)
    assert regcred is not None
    pod = manifests.instance_pod(
        spec,
        SETTINGS,
        cluster_group="gpu-west",
        owner=owner,
        pull_secrets=[regcred["metadata"]["name"], *SETTINGS.image_pull_secrets],
        ready_timeout=7260,
    )
    secret = manifests.instance_secret(spec, SETTINGS, owner=owner, secrets_json='{"API_KEY": "s3cret"}')
    return [manifests.icms_request(spec, SETTINGS), secret, regcred, pod]


@pytest.mark.parametrize("task", [False, True], ids=["function", "task"])
def test_instance_objects_match_the_golden_file(task: bool) -> None:
    path = GOLDEN / ("task_instance.yaml" if task else "function_instance.yaml")
    rendered = yaml.safe_dump_all(objects(task), sort_keys=False, width=120)
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(rendered)
    assert rendered == path.read_text()


@pytest.mark.parametrize("task", [False, True], ids=["function", "task"])
def test_instance_objects_are_valid_kubernetes_objects(task: bool) -> None:
    for obj in objects(task):
        if obj["kind"] != "ICMSRequest":  # a custom resource: its schema is the CRD's (deploy/crds)
            kubernetes_validate.validate(obj, "1.33.0", strict=True)


def test_the_worker_token_and_registry_credentials_never_appear_in_the_pod_or_the_request() -> None:
    request, secret, _, pod = objects(False)
    text = json.dumps([request, pod])
    assert "token-never-in-the-pod-spec" not in text
    assert CREDENTIALS not in text
    # The function's telemetry credentials reach the worker from the instance's Secret.
    (utils,) = (c for c in pod["spec"]["containers"] if c["name"] == "utils")
    (ref,) = (e for e in utils["env"] if e["name"] == env.NVCF_TELEMETRY_EXPORTS)
    key = ref["valueFrom"]["secretKeyRef"]["key"]
    assert ref["valueFrom"]["secretKeyRef"]["name"] == secret["metadata"]["name"]
    assert TELEMETRY_AUTH in base64.b64decode(secret["data"][key]).decode()


def test_the_pull_secret_keeps_only_the_image_registry() -> None:
    regcred = manifests.pull_secret(launch(), SETTINGS, owner=None)
    assert regcred is not None
    config = json.loads(base64.b64decode(regcred["data"][".dockerconfigjson"]))
    assert list(config["auths"]) == ["nvcr.io"]


def test_image_registries() -> None:
    assert pull_credentials.image_registry("nvcr.io/acme/x:1") == "nvcr.io"
    assert pull_credentials.image_registry("localhost:5000/x") == "localhost:5000"
    assert pull_credentials.image_registry("ubuntu:24.04") == "docker.io"
    assert pull_credentials.image_registry("library/ubuntu") == "docker.io"


def test_a_launch_without_an_image_is_refused_clearly() -> None:
    spec = launch()
    bare = spec.message.launch_specification
    contract = {k: v for k, v in bare.environment.items() if k != env.INFERENCE_CONTAINER}
    import attrs

    msg = attrs.evolve(
        spec.message, launch_specification=attrs.evolve(bare, container_image=None, environment=contract)
    )
    with pytest.raises(ValueError, match="names no container image"):
        manifests.instance_pod(
            attrs.evolve(spec, message=msg), SETTINGS, cluster_group="g", owner=None, pull_secrets=[], ready_timeout=1
        )


def test_the_operators_telemetry_proxy_reaches_the_worker_only() -> None:
    spec = launch(False)
    kwargs: dict[str, Any] = {"cluster_group": "g", "owner": None, "pull_secrets": [], "ready_timeout": 60}
    pod = manifests.instance_pod(spec, SETTINGS, telemetry_proxy="http://proxy.corp:3128", **kwargs)
    env_of = {c["name"]: {e["name"]: e.get("value") for e in c["env"]} for c in pod["spec"]["containers"]}
    assert env_of["utils"][env.NVCF_TELEMETRY_PROXY] == "http://proxy.corp:3128"
    assert env.NVCF_TELEMETRY_PROXY not in env_of["inference"]
    plain = manifests.instance_pod(spec, SETTINGS, **kwargs)
    assert all(e["name"] != env.NVCF_TELEMETRY_PROXY for c in plain["spec"]["containers"] for e in c["env"])
