"""The worker's settings, read from the instance environment contract (``contracts/env.py``)."""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from nvcf_mono.contracts import env
from nvcf_mono.errors import NvcfMonoError


class WorkerConfigError(NvcfMonoError):
    """The environment does not describe an instance the worker can serve."""


@attrs.frozen(kw_only=True)
class WorkerConfig:
    """Everything the worker needs to know about its instance."""

    worker_token: str
    grpc_address: str
    function_id: str
    function_version_id: str
    function_name: str
    nca_id: str
    instance_id: str
    inference_host: str = "127.0.0.1"
    inference_port: int = 8000
    inference_url: str = "/"
    inference_protocol: str = "http"
    health_endpoint: str = "/v2/health/ready"
    health_port: int = 8000
    health_protocol: str = "http"
    health_expected_status: int = 200
    health_timeout: float = 10.0
    health_interval: float = 1.0
    ready_timeout: float = 7200.0
    max_concurrency: int = 1
    own_health_port: int = 0
    backend: str = ""
    instance_type: str = ""
    region: str = ""
    gpu: str = ""
    asset_dir: str = "/tmp/nvcf-assets"
    response_dir: str = "/tmp/nvcf-responses"
    frame_size: int = 256 * 1024
    secrets_file: str | None = None

    @property
    def inference_base(self) -> str:
        return f"http://{self.inference_host}:{self.inference_port}"

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> WorkerConfig:
        """Read the contract; every problem in one error, one line each."""
        problems: list[str] = []

        def need(name: str) -> str:
            value = environ.get(name, "")
            if not value:
                problems.append(f"{name} is not set")
            return value

        def number(name: str, default: float, *, integer: bool = True) -> float:
            raw = environ.get(name)
            if raw is None or raw == "":
                return default
            try:
                return int(raw) if integer else float(raw)
            except ValueError:
                problems.append(f"{name} must be a number, got {raw!r}")
                return default

        port = int(number(env.INFERENCE_PORT, 8000))
        config = cls(
            worker_token=need(env.NVCF_WORKER_TOKEN),
            grpc_address=need(env.NVCF_FQDN_GRPC),
            function_id=need(env.FUNCTION_ID),
            function_version_id=need(env.FUNCTION_VERSION_ID),
            function_name=environ.get(env.FUNCTION_NAME, ""),
            nca_id=environ.get(env.NCA_ID, ""),
            instance_id=environ.get(env.INSTANCE_ID) or environ.get(env.ICMS_REQUEST_ID, "instance"),
            inference_host=environ.get(WORKER_INFERENCE_HOST, "127.0.0.1"),
            inference_port=port,
            inference_url=environ.get(env.INFERENCE_URL, "/"),
            inference_protocol=environ.get(env.INFERENCE_PROTOCOL, "http").lower(),
            health_endpoint=environ.get(env.INFERENCE_HEALTH_ENDPOINT, "/v2/health/ready"),
            health_port=int(number(env.INFERENCE_HEALTH_PORT, port)),
            health_protocol=environ.get(env.INFERENCE_HEALTH_PROTOCOL, "http").lower(),
            health_expected_status=int(number(env.INFERENCE_HEALTH_EXPECTED_RESPONSE_CODE, 200)),
            health_timeout=number(env.INFERENCE_HEALTH_TIMEOUT, 10.0, integer=False),
            health_interval=number(WORKER_HEALTH_INTERVAL, 1.0, integer=False),
            ready_timeout=number(WORKER_READY_TIMEOUT, 7200.0, integer=False),
            max_concurrency=max(1, int(number(env.MAX_REQUEST_CONCURRENCY, 1))),
            own_health_port=int(number(WORKER_HEALTH_PORT, 0)),
            backend=environ.get(env.BACKEND, ""),
            instance_type=environ.get(env.INSTANCE_TYPE, ""),
            region=environ.get(env.REGION, ""),
            gpu=environ.get(env.GPU_NAME, ""),
            asset_dir=environ.get(WORKER_ASSET_DIR, "/tmp/nvcf-assets"),
            response_dir=environ.get(WORKER_RESPONSE_DIR, "/tmp/nvcf-responses"),
            secrets_file=environ.get(WORKER_SECRETS_FILE) or None,
        )
        if problems:
            raise WorkerConfigError("\n".join(problems))
        return config


# Worker-side variables (set by the agent; listed in contracts/env.py's table).
WORKER_HEALTH_PORT = env.HEALTH_PORT
WORKER_INFERENCE_HOST = env.INFERENCE_HOST
WORKER_READY_TIMEOUT = env.INFERENCE_READY_TIMEOUT
WORKER_HEALTH_INTERVAL = env.WORKER_HEALTH_INTERVAL
WORKER_ASSET_DIR = env.BASE_ASSET_DIR
WORKER_RESPONSE_DIR = env.BASE_RESPONSE_DIR
WORKER_SECRETS_FILE = env.SECRETS_FILE
