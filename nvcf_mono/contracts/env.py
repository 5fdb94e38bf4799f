"""The instance environment contract: what the control plane puts in a creation message, what the
agent adds when it launches an instance, and who reads each variable (reference invocation §3.6,
compute-plane §1 "Environment keys").

``python -m nvcf_mono.contracts.env`` prints the table as Markdown; ``--write`` puts it in ``README.md``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import attrs


@attrs.frozen
class Var:
    """One variable of the contract."""

    name: str
    set_by: str
    read_by: str
    default: str
    meaning: str


CP, AGENT, WORKER = "control plane", "agent", "worker"
#: What functions see as their environment (``NVCF_ENV``, ``NVCF-ENV``): NVCF's own say ``prod`` or ``stg``.
PLATFORM_ENV = "nvcf-mono"

INFERENCE_CONTAINER = "INFERENCE_CONTAINER"
INFERENCE_CONTAINER_ARGS = "INFERENCE_CONTAINER_ARGS"
INFERENCE_CONTAINER_ENV = "INFERENCE_CONTAINER_ENV"
INFERENCE_URL = "INFERENCE_URL"
INFERENCE_PORT = "INFERENCE_PORT"
INFERENCE_PROTOCOL = "INFERENCE_PROTOCOL"
INFERENCE_HEALTH_ENDPOINT = "INFERENCE_HEALTH_ENDPOINT"
INFERENCE_HEALTH_PORT = "INFERENCE_HEALTH_PORT"
INFERENCE_HEALTH_PROTOCOL = "INFERENCE_HEALTH_PROTOCOL"
INFERENCE_HEALTH_EXPECTED_RESPONSE_CODE = "INFERENCE_HEALTH_EXPECTED_RESPONSE_CODE"
INFERENCE_HEALTH_TIMEOUT = "INFERENCE_HEALTH_TIMEOUT"
MAX_REQUEST_CONCURRENCY = "MAX_REQUEST_CONCURRENCY"
NVCF_WORKER_TOKEN = "NVCF_WORKER_TOKEN"
CONTAINER_REGISTRIES_CREDENTIALS = "CONTAINER_REGISTRIES_CREDENTIALS"
HELM_REGISTRIES_CREDENTIALS = "HELM_REGISTRIES_CREDENTIALS"
NVCF_FQDN_GRPC = "NVCF_FQDN_GRPC"
NVCF_FQDN_GRPC_FILE = "NVCF_FQDN_GRPC_FILE"
NVCF_FQDN_GRPC_TLS = "NVCF_FQDN_GRPC_TLS"
NVCF_FQDN_GRPC_CA = "NVCF_FQDN_GRPC_CA"
NVCF_TRACES_ENDPOINT = "NVCF_TRACES_ENDPOINT"
NVCF_TELEMETRY_EXPORTS = "NVCF_TELEMETRY_EXPORTS"
NVCF_TELEMETRY_PROXY = "NVCF_TELEMETRY_PROXY"
NCA_ID = "NCA_ID"
FUNCTION_ID = "FUNCTION_ID"
FUNCTION_NAME = "FUNCTION_NAME"
FUNCTION_VERSION_ID = "FUNCTION_VERSION_ID"
FUNCTION_TYPE = "FUNCTION_TYPE"
FUNCTION_SECRETS_PRESENT = "FUNCTION_SECRETS_PRESENT"
DEPLOYMENT_ID = "DEPLOYMENT_ID"
GPU_SPECIFICATION_ID = "GPU_SPECIFICATION_ID"
ICMS_REQUEST_ID = "ICMS_REQUEST_ID"
GPU_NAME = "GPU_NAME"
INSTANCE_TYPE = "INSTANCE_TYPE"
BACKEND = "BACKEND"
REGION = "REGION"
HELM_CHART_INFERENCE_SERVICE_NAME = "HELM_CHART_INFERENCE_SERVICE_NAME"
INSTANCE_ID = "INSTANCE_ID"
HEALTH_PORT = "HEALTH_PORT"
INFERENCE_HOST = "INFERENCE_HOST"
INFERENCE_READY_TIMEOUT = "INFERENCE_READY_TIMEOUT"
WORKER_HEALTH_INTERVAL = "WORKER_HEALTH_INTERVAL"
BASE_ASSET_DIR = "BASE_ASSET_DIR"
BASE_RESPONSE_DIR = "BASE_RESPONSE_DIR"
INFERENCE_ASSET_DIR = "INFERENCE_ASSET_DIR"
INFERENCE_RESPONSE_DIR = "INFERENCE_RESPONSE_DIR"
SECRETS_FILE = "SECRETS_FILE"
SECRETS_REFRESH_INTERVAL = "SECRETS_REFRESH_INTERVAL"
NVCF_INSTANCE_ID = "NVCF_INSTANCE_ID"
NVCF_CLUSTER_ID = "NVCF_CLUSTER_ID"
PORT = "PORT"
CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
NVCF_REGION = "NVCF_REGION"
NVCF_INSTANCETYPE = "NVCF_INSTANCETYPE"
NVCF_INSTANCETYPE_VALUE = "NVCF_INSTANCETYPE_VALUE"
NVCF_BACKEND = "NVCF_BACKEND"
NVCF_ENV = "NVCF_ENV"
NVCF_NCA_ID = "NVCF_NCA_ID"
NVCF_FUNCTION_ID = "NVCF_FUNCTION_ID"
NVCF_FUNCTION_VERSION_ID = "NVCF_FUNCTION_VERSION_ID"
NVCF_FUNCTION_NAME = "NVCF_FUNCTION_NAME"
NVCT_TASK_ID = "NVCT_TASK_ID"
NVCT_TASK_NAME = "NVCT_TASK_NAME"
NVCT_NCA_ID = "NVCT_NCA_ID"
NVCT_PROGRESS_FILE_PATH = "NVCT_PROGRESS_FILE_PATH"
NVCT_RESULTS_DIR = "NVCT_RESULTS_DIR"
NVCT_HEARTBEAT_INTERVAL = "NVCT_HEARTBEAT_INTERVAL"
NVCT_RESULT_HANDLING = "NVCT_RESULT_HANDLING"

CONTRACT: tuple[Var, ...] = (
    Var(INFERENCE_CONTAINER, CP, AGENT, "-", "The function's container image (local backend: an image catalog name)."),
    Var(INFERENCE_CONTAINER_ARGS, CP, AGENT, "empty", "containerArgs, split like a shell would."),
    Var(INFERENCE_CONTAINER_ENV, CP, AGENT, "[]", "containerEnvironment as JSON [{key, value}]."),
    Var(INFERENCE_URL, CP, WORKER, "-", "inferenceUrl: the path requests are sent to (/grpc: a gRPC function)."),
    Var(INFERENCE_PORT, CP, "worker, agent", "8000", "inferencePort of the inference server."),
    Var(INFERENCE_PROTOCOL, CP, WORKER, "http", "http or grpc."),
    Var(INFERENCE_HEALTH_ENDPOINT, CP, WORKER, "/v2/health/ready", "Health check path (gRPC: service name)."),
    Var(INFERENCE_HEALTH_PORT, CP, WORKER, "INFERENCE_PORT", "Port of the health check."),
    Var(INFERENCE_HEALTH_PROTOCOL, CP, WORKER, "http", "http or grpc."),
    Var(INFERENCE_HEALTH_EXPECTED_RESPONSE_CODE, CP, WORKER, "200", "Status that means healthy."),
    Var(INFERENCE_HEALTH_TIMEOUT, CP, WORKER, "10", "Seconds one health check may take."),
    Var(MAX_REQUEST_CONCURRENCY, CP, WORKER, "1", "Requests the instance serves at once."),
    Var(NVCF_WORKER_TOKEN, CP, "worker (never the inference process)", "-", "Per-instance token for ConnectOnce."),
    Var(
        CONTAINER_REGISTRIES_CREDENTIALS,
        CP,
        AGENT,
        "-",
        "The account's credentials for the image's registry (base64 JSON {k8sSecrets: [{auths}]}): a pull secret.",
    ),
    Var(
        HELM_REGISTRIES_CREDENTIALS,
        CP,
        AGENT,
        "-",
        "Helm functions: the account's credentials for the chart's host (same shape), to fetch the chart.",
    ),
    Var(NVCF_FQDN_GRPC, CP, WORKER, "-", "host:port of the WorkerService (invocation plane gRPC)."),
    Var(NVCF_FQDN_GRPC_TLS, CP, WORKER, "false", "true when the WorkerService's port speaks TLS."),
    Var(
        NVCF_FQDN_GRPC_CA,
        CP,
        WORKER,
        "-",
        "PEM certificates the worker trusts for that TLS (unset: the system's CAs).",
    ),
    Var(
        NVCF_TRACES_ENDPOINT,
        CP,
        WORKER,
        "-",
        "OTLP/HTTP collector the worker sends its spans to (the platform's tracing.otlp_endpoint; unset: none).",
    ),
    Var(
        NVCF_TELEMETRY_EXPORTS,
        CP,
        "worker, agent",
        "-",
        "A function's or task's telemetries: JSON {traces|metrics|logs: {url, headers, networks}}, the OTLP/HTTP "
        "receivers the worker sends its spans, the instance's request metrics and its log to, and the agent the "
        "workload's output (unset: none); each is reached only at public addresses and in its networks (CIDR).",
    ),
    Var(
        NVCF_TELEMETRY_PROXY,
        AGENT,
        WORKER,
        "-",
        "The cluster operator's HTTP proxy (plugins.compute.telemetry_proxy) the worker reaches the workload's "
        "telemetry receivers through (unset: directly).",
    ),
    Var(
        NVCF_FQDN_GRPC_FILE,
        AGENT,
        WORKER,
        "-",
        "Local backend: a file with the WorkerService's current host:port, read before each connection "
        "(rewritten when the platform comes back on other ports).",
    ),
    Var(NCA_ID, CP, "worker, agent", "-", "The function's account."),
    Var(FUNCTION_ID, CP, "worker, agent", "-", "Function id."),
    Var(FUNCTION_NAME, CP, WORKER, "-", "Function name."),
    Var(FUNCTION_VERSION_ID, CP, "worker, agent", "-", "Function version id."),
    Var(FUNCTION_TYPE, CP, WORKER, "DEFAULT", "DEFAULT or STREAMING."),
    Var(FUNCTION_SECRETS_PRESENT, CP, WORKER, "false", "true when the worker must fetch secrets at launch."),
    Var(DEPLOYMENT_ID, CP, AGENT, "-", "Deployment id."),
    Var(GPU_SPECIFICATION_ID, CP, AGENT, "-", "GPU specification id (echoed in status reports)."),
    Var(ICMS_REQUEST_ID, CP, "worker, agent", "-", "The instance request this instance serves."),
    Var(GPU_NAME, CP, "worker, agent", "-", "GPU model."),
    Var(INSTANCE_TYPE, CP, "worker, agent", "-", "Instance type name."),
    Var(BACKEND, CP, WORKER, "-", "Cluster group (backend) name."),
    Var(REGION, CP, WORKER, "-", "Region of the cluster."),
    Var(HELM_CHART_INFERENCE_SERVICE_NAME, CP, "worker, agent", "-", "Helm functions: the Service to call."),
    Var(INSTANCE_ID, AGENT, "worker, inference", "-", "The instance's id (a pod or process name)."),
    Var(HEALTH_PORT, AGENT, WORKER, "0 (any)", "Port of the worker's own /v1/health/live and /ready (per instance)."),
    Var(INFERENCE_HOST, AGENT, WORKER, "127.0.0.1", "Host of the inference server (a Service name for Helm)."),
    Var(INFERENCE_READY_TIMEOUT, AGENT, WORKER, "7200", "Seconds to wait for the inference server to be healthy."),
    Var(WORKER_HEALTH_INTERVAL, AGENT, WORKER, "1", "Seconds between health checks of the inference server."),
    Var(BASE_ASSET_DIR, AGENT, WORKER, "/tmp/nvcf-assets", "Where input assets are downloaded (per request)."),
    Var(BASE_RESPONSE_DIR, AGENT, WORKER, "/tmp/nvcf-responses", "Per-request output dir (NVCF-LARGE-OUTPUT-DIR)."),
    Var(
        INFERENCE_ASSET_DIR,
        AGENT,
        WORKER,
        "BASE_ASSET_DIR",
        "BASE_ASSET_DIR as the inference server sees it (a mount).",
    ),
    Var(
        INFERENCE_RESPONSE_DIR,
        AGENT,
        WORKER,
        "BASE_RESPONSE_DIR",
        "BASE_RESPONSE_DIR as the inference server sees it (a mount).",
    ),
    Var(SECRETS_FILE, AGENT, "worker, inference", "-", "Where the worker writes the instance's secrets (JSON)."),
    Var(
        SECRETS_REFRESH_INTERVAL,
        AGENT,
        WORKER,
        "10",
        "Seconds between the worker's fetches of updated secrets (0: only at start).",
    ),
    Var(NVCF_INSTANCE_ID, AGENT, "worker, inference", "-", "The same as INSTANCE_ID (NVCF sets both)."),
    Var(NVCF_CLUSTER_ID, AGENT, AGENT, "-", "The cluster whose agent started the process (finds orphans)."),
    Var(PORT, AGENT, "inference", "-", "Local backend: the port the inference server listens on (= INFERENCE_PORT)."),
    Var(CUDA_VISIBLE_DEVICES, AGENT, "inference", "-", "Local backend: the GPU devices of the instance."),
    Var(NVCF_REGION, AGENT, "inference", "-", "Region of the cluster (NVCF's pod fieldRef)."),
    Var(NVCF_INSTANCETYPE, AGENT, "inference", "-", "Instance type name (NVCF's pod fieldRef)."),
    Var(NVCF_INSTANCETYPE_VALUE, AGENT, "inference", "-", "Instance type value, without _<n>x."),
    Var(NVCF_BACKEND, AGENT, "inference", "-", "Cluster group (backend) name."),
    Var(NVCF_ENV, AGENT, "inference", PLATFORM_ENV, "The platform's environment (also each request's NVCF-ENV)."),
    Var(NVCF_NCA_ID, AGENT, "inference", "-", "The function's account."),
    Var(NVCF_FUNCTION_ID, AGENT, "inference", "-", "Function id."),
    Var(NVCF_FUNCTION_VERSION_ID, AGENT, "inference", "-", "Function version id."),
    Var(NVCF_FUNCTION_NAME, AGENT, "inference", "-", "Function name."),
    Var(NVCT_TASK_ID, CP, "task, worker", "-", "Tasks: the task's id (its presence makes the worker a task sidecar)."),
    Var(NVCT_TASK_NAME, CP, "task, worker", "-", "Tasks: the task's name."),
    Var(NVCT_NCA_ID, CP, "task, worker", "-", "Tasks: the task's account."),
    Var(NVCT_PROGRESS_FILE_PATH, AGENT, "task, worker", "-", "Tasks: where the task writes its progress (JSON)."),
    Var(NVCT_RESULTS_DIR, AGENT, "task, worker", "-", "Tasks: where the task writes result files."),
    Var(NVCT_HEARTBEAT_INTERVAL, CP, WORKER, "30", "Tasks: seconds between the worker's heartbeats."),
    Var(NVCT_RESULT_HANDLING, CP, WORKER, "UPLOAD", "Tasks: UPLOAD (store result files) or NONE (names only)."),
)


def markdown() -> str:
    """The contract as a Markdown table."""
    lines = ["| variable | set by | read by | default | meaning |", "|---|---|---|---|---|"]
    lines += [f"| `{v.name}` | {v.set_by} | {v.read_by} | {v.default} | {v.meaning} |" for v in CONTRACT]
    return "\n".join(lines)


BEGIN, END = "<!-- env-contract:begin -->", "<!-- env-contract:end -->"


def update_readme(path: Path) -> None:
    """Replace the table between the markers of ``contracts/README.md``."""
    text = path.read_text()
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    path.write_text(f"{head}{BEGIN}\n{markdown()}\n{END}{tail}")


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        update_readme(Path(__file__).with_name("README.md"))
    else:
        print(markdown())
