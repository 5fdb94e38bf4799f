"""The Kubernetes objects of one instance: its Pod, its Secret, its pull secret, its request's ICMSRequest
(reference compute-plane §2 and §3: names, containers, probes, labels, annotations, affinity).

Pure: a launch spec and the cluster's settings in, plain manifests (dicts) out. The golden-file test
fixes their exact shape.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from nvcf_mono.contracts import env, kube_labels, pull_credentials
from nvcf_mono.contracts.messages import CreationMessage
from nvcf_mono.models.common import duration_seconds
from nvcf_mono.planes.compute import workload
from nvcf_mono.planes.compute.backends import LaunchSpec
from nvcf_mono.planes.compute.config import KubernetesSettings

Manifest = dict[str, Any]

ICMS_GROUP = "nvca.nvcf.nvidia.io"
ICMS_VERSION = "v2beta1"
ICMS_PLURAL = "icmsrequests"

#: Node label GPU nodes carry (``<PROVIDER>.GPU.<GPU>``); instance pods require it.
INSTANCE_TYPE_LABEL = "nvca.nvcf.nvidia.io/instance-type"
#: Which agent's pods these are (one namespace may serve several clusters' agents).
CLUSTER_LABEL = "nvca.nvcf.nvidia.io/cluster-id"
INSTANCE_LABEL = "nvca.nvcf.nvidia.io/instance-id"
TASK_LABEL = "nvca.nvcf.nvidia.io/task-id"
#: The port of the utils container's ``/v1/health/live|ready`` (NVCA's probes use 8080).
WORKER_HEALTH_PORT = 8080
INFERENCE, UTILS, TASK = "inference", "utils", "task"
#: Where the containers share request inputs and outputs, and where the secrets are mounted.
DATA_DIR = "/var/inf"
SECRETS_DIR = "/var/secrets"
TASK_DIR = "/var/task"
SECRET_TOKEN_KEY = "worker-token"
SECRET_FILE_KEY = "secrets.json"
SECRET_TELEMETRY_KEY = "telemetry-exports"
#: Keys of the contract that never reach a pod spec in the clear.
_SENSITIVE = frozenset(
    {
        env.NVCF_WORKER_TOKEN,
        env.CONTAINER_REGISTRIES_CREDENTIALS,
        env.HELM_REGISTRIES_CREDENTIALS,
        env.NVCF_TELEMETRY_EXPORTS,
    }
)
MAX_QUEUED_ANNOTATION = kube_labels.MAX_QUEUED_SECONDS
#: A task's grace period is at least an hour (reference compute-plane §3, container tasks).
TASK_MIN_GRACE = 3600.0

_LABEL_VALUE_RX = re.compile(r"[^A-Za-z0-9._-]+")


def label_value(text: str | None) -> str:
    """A valid label value: at most 63 characters of ``[A-Za-z0-9._-]``, alphanumeric at both ends."""
    cleaned = _LABEL_VALUE_RX.sub("-", text or "")[:63]
    return cleaned.strip("-_.")


def request_name(request_id: str) -> str:
    """The ICMSRequest of a request: ``sr-<request id>``; its pods are ``<i>-sr-<request id>``."""
    return f"sr-{request_id}"[:63].rstrip("-")


def secret_name(instance_id: str) -> str:
    return f"{instance_id}"[:55].rstrip("-") + "-secrets"


def pull_secret_name(instance_id: str) -> str:
    return f"workload-{instance_id}"[:52].rstrip("-") + "-regcred-0"


def is_task(message: CreationMessage) -> bool:
    return message.task_details is not None


def _gpu_resources(message: CreationMessage) -> dict[str, str]:
    return {"nvidia.com/gpu": str(max(message.requested_gpu_count, 1))}


def instance_labels(spec: LaunchSpec) -> dict[str, str]:
    """Labels of an instance's pod and secrets (NVCA's, plus the agent's own selectors)."""
    msg = spec.message
    labels = {
        "icms-request-id": msg.request_id,
        "nca-id": msg.nca_id,
        kube_labels.MESSAGE_BATCH_ID: msg.message_batch_id,
        "gpu-name": msg.gpu_type,
        "GPU_COUNT": str(max(msg.requested_gpu_count, 1)),
        CLUSTER_LABEL: spec.cluster_id,
        INSTANCE_LABEL: spec.instance_id,
    }
    if msg.deployment_id:
        labels[kube_labels.DEPLOYMENT_ID] = msg.deployment_id
    if msg.gpu_specification_id:
        labels[kube_labels.GPU_SPECIFICATION_ID] = msg.gpu_specification_id
    if msg.function_details is not None:
        labels["function-id"] = msg.function_details.function_id
        labels["function-version-id"] = msg.function_details.function_version_id
    if msg.task_details is not None:
        labels[TASK_LABEL] = msg.task_details.task_id
    return {k: label_value(v) for k, v in labels.items() if label_value(v)}


def instance_annotations(spec: LaunchSpec, cluster_group: str) -> dict[str, str]:
    msg = spec.message
    contract = msg.launch_specification.environment
    out = {
        "nca-id": msg.nca_id,
        "instance-count": str(msg.instance_count),
        "icms-cluster-group": cluster_group,
        kube_labels.REGION: contract.get(env.REGION, ""),
        kube_labels.BACKEND: contract.get(env.BACKEND, cluster_group),
        kube_labels.INSTANCE_TYPE_NAME: msg.instance_type_name,
        kube_labels.INSTANCE_TYPE_VALUE: msg.instance_type_value,
        kube_labels.ENVIRONMENT: env.PLATFORM_ENV,
    }
    if msg.function_details is not None and msg.function_details.function_name:
        out["function-name"] = msg.function_details.function_name
    if msg.task_details is not None and msg.task_details.task_name:
        out["task-name"] = msg.task_details.task_name
    queued = msg.launch_specification.max_queued_duration
    if msg.task_details is not None and queued:
        # A task may wait this long for a node (NVCA's scheduling timeout for tasks).
        out[MAX_QUEUED_ANNOTATION] = f"{duration_seconds(queued):g}"
    return out


def owner_reference(icms_request: Mapping[str, Any]) -> dict[str, Any] | None:
    """The ICMSRequest as owner (pods and secrets go with it); None before the server gave it a uid."""
    meta = icms_request.get("metadata", {})
    if not meta.get("uid"):
        return None
    return {
        "apiVersion": f"{ICMS_GROUP}/{ICMS_VERSION}",
        "kind": "ICMSRequest",
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _metadata(
    name: str, namespace: str, labels: Mapping[str, str], owner: Mapping[str, Any] | None, **extra: Any
) -> Manifest:
    meta: Manifest = {"name": name, "namespace": namespace, "labels": dict(labels), **extra}
    if owner is not None:
        meta["ownerReferences"] = [dict(owner)]
    return meta


def _env_list(values: Mapping[str, str]) -> list[Manifest]:
    return [{"name": k, "value": v} for k, v in values.items()]


def _annotation_ref(name: str, annotation: str) -> Manifest:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{annotation}']"}}}


def _label_ref(name: str, label: str) -> Manifest:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{label}']"}}}


def _workload_env(spec: LaunchSpec) -> list[Manifest]:
    """The user container's env: its containerEnvironment, its identity, NVCF's pod fields."""
    contract = spec.message.launch_specification.environment
    values = {
        **workload.container_environment(contract),
        env.INSTANCE_ID: spec.instance_id,
        env.NVCF_INSTANCE_ID: spec.instance_id,
        env.SECRETS_FILE: f"{SECRETS_DIR}/{SECRET_FILE_KEY}",
    }
    port = contract.get(env.INFERENCE_PORT)
    if port and not is_task(spec.message):
        values[env.INFERENCE_PORT] = port
    out = _env_list(values)
    out += [
        _annotation_ref(env.NVCF_REGION, kube_labels.REGION),
        _annotation_ref(env.NVCF_INSTANCETYPE, kube_labels.INSTANCE_TYPE_NAME),
        _annotation_ref(env.NVCF_INSTANCETYPE_VALUE, kube_labels.INSTANCE_TYPE_VALUE),
        _annotation_ref(env.NVCF_BACKEND, kube_labels.BACKEND),
        _annotation_ref("NVCF_ENV", kube_labels.ENVIRONMENT),
        _annotation_ref(env.NVCF_NCA_ID, "nca-id"),
    ]
    if spec.message.function_details is not None:
        out += [
            _label_ref(env.NVCF_FUNCTION_ID, "function-id"),
            _label_ref(env.NVCF_FUNCTION_VERSION_ID, "function-version-id"),
            {"name": env.NVCF_FUNCTION_NAME, "value": spec.message.function_details.function_name or ""},
        ]
    return out


def _worker_env(
    spec: LaunchSpec, settings: KubernetesSettings, ready_timeout: float, telemetry_proxy: str | None
) -> list[Manifest]:
    """The utils container's env: the whole contract (the token by reference), pointed at the pod's paths."""
    contract = spec.message.launch_specification.environment
    values = {k: v for k, v in contract.items() if k not in _SENSITIVE}
    values.update(
        {
            env.INSTANCE_ID: spec.instance_id,
            env.NVCF_INSTANCE_ID: spec.instance_id,
            env.NVCF_CLUSTER_ID: spec.cluster_id,
            env.HEALTH_PORT: str(WORKER_HEALTH_PORT),
            env.INFERENCE_HOST: "127.0.0.1",
            env.INFERENCE_READY_TIMEOUT: f"{ready_timeout:g}",
            env.BASE_ASSET_DIR: f"{DATA_DIR}/assets",
            env.BASE_RESPONSE_DIR: f"{DATA_DIR}/responses",
            # The agent keeps the secrets in the instance's Secret (mounted, read-only): the worker has no
            # file to write. It still asks every secrets_refresh, for its telemetry endpoints' secrets.
            env.FUNCTION_SECRETS_PRESENT: "false",
            env.SECRETS_REFRESH_INTERVAL: f"{settings.secrets_refresh:g}",
        }
    )
    values.pop(env.SECRETS_FILE, None)
    if is_task(spec.message):
        values.update(_task_paths())
    if telemetry_proxy:
        values[env.NVCF_TELEMETRY_PROXY] = telemetry_proxy
    out = _env_list(dict(sorted(values.items())))
    out.append(
        {
            "name": env.NVCF_WORKER_TOKEN,
            "valueFrom": {"secretKeyRef": {"name": secret_name(spec.instance_id), "key": SECRET_TOKEN_KEY}},
        }
    )
    if contract.get(env.NVCF_TELEMETRY_EXPORTS):  # the function's telemetry credentials: by reference too
        out.append(
            {
                "name": env.NVCF_TELEMETRY_EXPORTS,
                "valueFrom": {"secretKeyRef": {"name": secret_name(spec.instance_id), "key": SECRET_TELEMETRY_KEY}},
            }
        )
    return out


def _task_paths() -> dict[str, str]:
    return {
        env.NVCT_RESULTS_DIR: f"{TASK_DIR}/results",
        env.NVCT_PROGRESS_FILE_PATH: f"{TASK_DIR}/results/progress",
    }


def _task_env(spec: LaunchSpec) -> list[Manifest]:
    launch = spec.message.launch_specification
    contract = launch.environment
    values = {
        **_task_paths(),
        "NVCT_MAX_RUN_TIME_DURATION": launch.max_runtime_duration or "",
        "NVCT_RESULT_HANDLING_STRATEGY": launch.result_handling_strategy or contract.get(env.NVCT_RESULT_HANDLING, ""),
        **{k: contract[k] for k in (env.NVCT_TASK_ID, env.NVCT_TASK_NAME, env.NVCT_NCA_ID) if k in contract},
    }
    return _env_list(values)


def _probes() -> dict[str, Manifest]:
    """NVCA's probes of the utils container (reference compute-plane §3)."""

    def get(path: str) -> Manifest:
        return {"path": path, "port": WORKER_HEALTH_PORT}

    return {
        "startupProbe": {"httpGet": get("/v1/health/live"), "periodSeconds": 1, "failureThreshold": 60},
        "readinessProbe": {
            "httpGet": get("/v1/health/ready"),
            "periodSeconds": 10,
            "failureThreshold": 2,
            "timeoutSeconds": 6,
        },
        "livenessProbe": {"httpGet": get("/v1/health/live"), "periodSeconds": 10, "failureThreshold": 2},
    }


_DROP_ALL = {"capabilities": {"drop": ["ALL"]}, "allowPrivilegeEscalation": False}


def tolerations(settings: KubernetesSettings) -> list[Manifest]:
    out: list[Manifest] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    for t in settings.tolerations:
        item: Manifest = {"operator": t.operator}
        if t.key:
            item["key"] = t.key
        if t.value is not None and t.operator == "Equal":
            item["value"] = t.value
        if t.effect:
            item["effect"] = t.effect
        out.append(item)
    return out


def affinity(instance_type_value: str) -> Manifest:
    term = {"matchExpressions": [{"key": INSTANCE_TYPE_LABEL, "operator": "In", "values": [instance_type_value]}]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}


def grace_seconds(spec: LaunchSpec, settings: KubernetesSettings) -> int:
    """Function pods: the configured grace; task pods: at least an hour, or the task's own grace."""
    if not is_task(spec.message):
        return int(settings.termination_grace)
    raw = spec.message.launch_specification.termination_grace_period_duration
    own = duration_seconds(raw) if raw else 0.0
    return int(max(TASK_MIN_GRACE, own))


def max_runtime(spec: LaunchSpec) -> float | None:
    raw = spec.message.launch_specification.max_runtime_duration
    return duration_seconds(raw) if raw else None


def instance_pod(
    spec: LaunchSpec,
    settings: KubernetesSettings,
    *,
    cluster_group: str,
    owner: Mapping[str, Any] | None,
    pull_secrets: Sequence[str],
    ready_timeout: float,
    worker_only: bool = False,
    telemetry_proxy: str | None = None,
) -> Manifest:
    """The Pod of a container function (``inference`` + ``utils``) or task (``task`` + ``utils``); with
    ``worker_only``, a Helm instance's ``utils`` pod (the chart runs the workload).

    Raises ValueError when the launch spec cannot make a pod (no image, unreadable args or env).
    """
    msg = spec.message
    image = workload.image_of(msg) or ("" if not worker_only else "-")
    if not image:
        raise ValueError("the launch specification names no container image")
    task = is_task(msg)
    main = _workload_container(spec, image)
    utils = _utils_container(spec, settings, ready_timeout, telemetry_proxy)
    volumes: list[Manifest] = [
        {"name": "inference-data", "emptyDir": {}},
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
        {"name": "secret-data", "secret": {"secretName": secret_name(spec.instance_id), "defaultMode": 0o440}},
    ]
    if task:
        volumes.append({"name": "task-data", "emptyDir": {}})
    pod_spec: Manifest = {
        "restartPolicy": "Never" if task else "Always",
        "terminationGracePeriodSeconds": grace_seconds(spec, settings),
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "tolerations": tolerations(settings),
        "affinity": affinity(msg.instance_type_value),
        "volumes": volumes,
    }
    if worker_only:
        pod_spec.pop("affinity")  # the worker needs no GPU node
        pod_spec["restartPolicy"] = "Always"
        pod_spec["containers"] = [utils]
        pod_spec["volumes"] = [v for v in volumes if v["name"] != "dshm"]
        pod_spec["terminationGracePeriodSeconds"] = int(settings.termination_grace)
    elif task:
        # The worker is a native sidecar: it starts first, and when the task's container ends the
        # kubelet stops it (SIGTERM), so it uploads what is left and the pod completes.
        utils["restartPolicy"] = "Always"
        pod_spec["initContainers"] = [utils]
        pod_spec["containers"] = [main]
        deadline = max_runtime(spec)
        if deadline is not None:
            pod_spec["activeDeadlineSeconds"] = max(1, int(deadline))
    else:
        pod_spec["containers"] = [main, utils]
    if pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": n} for n in pull_secrets]
    if settings.priority_class_name:
        pod_spec["priorityClassName"] = settings.priority_class_name
    if settings.scheduler_name:
        pod_spec["schedulerName"] = settings.scheduler_name
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _metadata(
            spec.instance_id,
            settings.namespace,
            instance_labels(spec),
            owner,
            annotations=instance_annotations(spec, cluster_group),
        ),
        "spec": pod_spec,
    }


def _workload_container(spec: LaunchSpec, image: str) -> Manifest:
    """The function's (``inference``) or task's (``task``) container."""
    task = is_task(spec.message)
    contract = spec.message.launch_specification.environment
    main: Manifest = {
        "name": TASK if task else INFERENCE,
        "image": image,
        "env": _workload_env(spec) + (_task_env(spec) if task else []),
        "resources": {"limits": _gpu_resources(spec.message)},
        "securityContext": {"capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}},
        "volumeMounts": [
            {"name": "inference-data", "mountPath": DATA_DIR},
            {"name": "dshm", "mountPath": "/dev/shm"},
            {"name": "secret-data", "mountPath": SECRETS_DIR, "readOnly": True},
        ]
        + ([{"name": "task-data", "mountPath": TASK_DIR}] if task else []),
    }
    args = workload.container_args(contract.get(env.INFERENCE_CONTAINER_ARGS, ""))
    if args:
        main["args"] = args
    return main


def _utils_container(
    spec: LaunchSpec, settings: KubernetesSettings, ready_timeout: float, telemetry_proxy: str | None
) -> Manifest:
    """The worker (``utils``): this project's image running ``nvcf-mono worker``."""
    task = is_task(spec.message)
    return {
        "name": UTILS,
        "image": settings.worker_image,
        "imagePullPolicy": settings.worker_pull_policy,
        "command": ["nvcf-mono", "worker"],
        "env": _worker_env(spec, settings, ready_timeout, telemetry_proxy),
        "ports": [{"name": "health", "containerPort": WORKER_HEALTH_PORT, "protocol": "TCP"}],
        "securityContext": dict(_DROP_ALL),
        "volumeMounts": [
            {"name": "inference-data", "mountPath": DATA_DIR},
            {"name": "secret-data", "mountPath": SECRETS_DIR, "readOnly": True},
        ]
        + ([{"name": "task-data", "mountPath": TASK_DIR}] if task else []),
        **_probes(),
    }


def instance_secret(
    spec: LaunchSpec, settings: KubernetesSettings, *, owner: Mapping[str, Any] | None, secrets_json: str | None
) -> Manifest:
    """The instance's own Secret: the worker's token, the function's telemetry credentials, and the function's
    or task's secrets (mounted).
    """
    contract = spec.message.launch_specification.environment
    token = contract.get(env.NVCF_WORKER_TOKEN, "")
    data = {SECRET_TOKEN_KEY: token, SECRET_FILE_KEY: secrets_json if secrets_json is not None else "{}"}
    if contract.get(env.NVCF_TELEMETRY_EXPORTS):
        data[SECRET_TELEMETRY_KEY] = contract[env.NVCF_TELEMETRY_EXPORTS]
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": _metadata(secret_name(spec.instance_id), settings.namespace, instance_labels(spec), owner),
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
    }


def pull_secret(
    spec: LaunchSpec, settings: KubernetesSettings, *, owner: Mapping[str, Any] | None, every_registry: bool = False
) -> Manifest | None:
    """``workload-<instance>-regcred-0``: the account's registry credentials for the image's registry (with
    ``every_registry``, a Helm chart's: all of them, its images may come from any). None when there are none.
    """
    contract = spec.message.launch_specification.environment
    raw = contract.get(env.CONTAINER_REGISTRIES_CREDENTIALS, "").strip()
    image = workload.image_of(spec.message)
    if not raw or not (image or every_registry):
        return None
    auths = pull_credentials.auths_for(raw, None if every_registry else pull_credentials.image_registry(image))
    if not auths:
        return None
    config = json.dumps({"auths": auths}, sort_keys=True)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/dockerconfigjson",
        "metadata": _metadata(pull_secret_name(spec.instance_id), settings.namespace, instance_labels(spec), owner),
        "data": {".dockerconfigjson": base64.b64encode(config.encode()).decode()},
    }


def _redacted_environment(message: CreationMessage) -> dict[str, str]:
    return {
        k: ("<redacted>" if k in _SENSITIVE else v) for k, v in sorted(message.launch_specification.environment.items())
    }


def icms_request(spec: LaunchSpec, settings: KubernetesSettings) -> Manifest:
    """The ICMSRequest of a creation message (secrets redacted: it is readable to anyone who can list it)."""
    msg = spec.message
    labels = {
        "SQSMessageID": message_id(msg.request_id),
        "icms-request-id": msg.request_id,
        "nca-id": f"nca-{msg.nca_id}-nca",
        kube_labels.MESSAGE_BATCH_ID: msg.message_batch_id,
        "gpu-name": msg.gpu_type,
        CLUSTER_LABEL: spec.cluster_id,
    }
    if msg.function_details is not None:
        labels["nvca.nvcf.nvidia.io/function-id"] = msg.function_details.function_id
        labels["nvca.nvcf.nvidia.io/function-version-id"] = msg.function_details.function_version_id
    if msg.task_details is not None:
        labels["nvca.nvcf.nvidia.io/task-id"] = msg.task_details.task_id
    launch = msg.launch_specification
    launch_spec: Manifest = {
        "gpuName": launch.gpu_name,
        "environment": _redacted_environment(msg),
    }
    for key, value in (
        ("containerImage", launch.container_image),
        ("helmChart", launch.helm_chart),
        ("maxRuntimeDuration", launch.max_runtime_duration),
        ("maxQueuedDuration", launch.max_queued_duration),
        ("terminationGracePeriodDuration", launch.termination_grace_period_duration),
        ("resultHandlingStrategy", launch.result_handling_strategy),
    ):
        if value is not None:
            launch_spec[key] = value
    creation: Manifest = {
        "requestId": msg.request_id,
        "ncaId": msg.nca_id,
        "messageBatchId": msg.message_batch_id,
        "action": msg.action.value,
        "instanceCount": msg.instance_count,
        "instanceTypeName": msg.instance_type_name,
        "instanceTypeValue": msg.instance_type_value,
        "gpuType": msg.gpu_type,
        "gpuName": launch.gpu_name,
        "requestedGPUCount": msg.requested_gpu_count,
        ("taskLaunchSpecification" if is_task(msg) else "functionLaunchSpecification"): launch_spec,
    }
    if msg.deployment_id:
        creation["deploymentId"] = msg.deployment_id
    body: Manifest = {
        "requestId": msg.request_id,
        "ncaId": msg.nca_id,
        "messageBatchId": msg.message_batch_id,
        "action": msg.action.value,
        "creationMsgInfo": creation,
    }
    if msg.function_details is not None:
        body["functionDetails"] = {
            "functionId": msg.function_details.function_id,
            "functionVersionId": msg.function_details.function_version_id,
            "functionType": msg.function_details.function_type,
        }
    if msg.task_details is not None:
        body["taskDetails"] = {"taskId": msg.task_details.task_id, "taskType": msg.task_details.task_type}
    return {
        "apiVersion": f"{ICMS_GROUP}/{ICMS_VERSION}",
        "kind": "ICMSRequest",
        "metadata": {
            "name": request_name(msg.request_id),
            "namespace": settings.namespace,
            "labels": {k: label_value(v) for k, v in labels.items() if label_value(v)},
        },
        "spec": body,
    }


def message_id(request_id: str) -> str:
    """The ``SQSMessageID`` label: NVCA's shape (63 hex characters of a sha256), of the request id (which
    the agent deduplicates by).
    """
    return hashlib.sha256(request_id.encode()).hexdigest()[:63]
