"""The worker's settings, read from the instance environment contract (``contracts/env.py``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import attrs

from nvcf_mono.contracts import env
from nvcf_mono.errors import NvcfMonoError
from nvcf_mono.worker import endpoint

PROTOCOLS = ("http", "grpc")
FUNCTION_TYPES = ("DEFAULT", "STREAMING", "LLM")
#: NVCF's API caps maxRequestConcurrency at this.
MAX_CONCURRENCY = 16384


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
    function_type: str = "DEFAULT"
    secrets_present: bool = False
    asset_dir: str = "/tmp/nvcf-assets"
    response_dir: str = "/tmp/nvcf-responses"
    frame_size: int = 256 * 1024
    secrets_file: str | None = None
    #: A file the agent keeps the platform's current address in (read before each connection).
    grpc_address_file: str | None = None
    #: How often a running request's progress file is looked at.
    progress_interval: float = 0.1

    @property
    def inference_base(self) -> str:
        return f"http://{self.inference_host}:{self.inference_port}"

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> WorkerConfig:
        """Read the contract; every problem in one error, one line each."""
        problems: list[str] = []

        def text(name: str, default: str = "") -> str:
            return environ.get(name, "").strip() or default

        def need(name: str) -> str:
            value = text(name)
            if not value:
                problems.append(f"{name} is not set")
            return value

        def number(
            name: str, default: float, *, integer: bool = True, check: Callable[[float], str | None] | None = None
        ) -> float:
            raw = environ.get(name, "").strip()
            if not raw:
                return default
            try:
                value: float = int(raw) if integer else float(raw)
            except ValueError:
                kind = "a whole number" if integer else "a number"
                problems.append(f"{name} must be {kind}, got {raw!r}")
                return default
            why = check(value) if check is not None else None
            if why is not None:
                problems.append(f"{name} {why}, got {raw!r}")
                return default
            return value

        def choice(name: str, default: str, allowed: tuple[str, ...], *, upper: bool = False) -> str:
            raw = text(name, default)
            value = raw.upper() if upper else raw.lower()
            if value not in allowed:
                problems.append(f"{name} must be one of {', '.join(allowed)}, got {raw!r}")
                return default
            return value

        def between(low: float, high: float) -> Callable[[float], str | None]:
            return lambda v: None if low <= v <= high else f"must be between {low:g} and {high:g}"

        def positive(v: float) -> str | None:
            return None if v > 0 else "must be greater than 0"

        def path(name: str, default: str) -> str:
            value = text(name, default)
            if not value.startswith("/"):
                problems.append(f"{name} must be a path starting with '/', got {value!r}")
                return default
            return value

        grpc_address = need(env.NVCF_FQDN_GRPC)
        if grpc_address and endpoint.parse(grpc_address) is None:
            problems.append(f"{env.NVCF_FQDN_GRPC} must be host:port, got {grpc_address!r}")
        port = int(number(env.INFERENCE_PORT, 8000, check=between(1, 65535)))
        secrets_raw = text(env.FUNCTION_SECRETS_PRESENT, "false").lower()
        if secrets_raw not in ("true", "false"):
            problems.append(f"{env.FUNCTION_SECRETS_PRESENT} must be true or false, got {secrets_raw!r}")
        config = cls(
            worker_token=need(env.NVCF_WORKER_TOKEN),
            grpc_address=grpc_address,
            grpc_address_file=text(env.NVCF_FQDN_GRPC_FILE) or None,
            function_id=need(env.FUNCTION_ID),
            function_version_id=need(env.FUNCTION_VERSION_ID),
            function_name=text(env.FUNCTION_NAME),
            nca_id=text(env.NCA_ID),
            instance_id=text(env.INSTANCE_ID) or text(env.NVCF_INSTANCE_ID) or text(env.ICMS_REQUEST_ID, "instance"),
            # A Helm function's inference server is its Service, unless the agent says otherwise.
            inference_host=text(WORKER_INFERENCE_HOST) or text(env.HELM_CHART_INFERENCE_SERVICE_NAME, "127.0.0.1"),
            inference_port=port,
            inference_url=path(env.INFERENCE_URL, "/"),
            inference_protocol=choice(env.INFERENCE_PROTOCOL, "http", PROTOCOLS),
            health_endpoint=text(env.INFERENCE_HEALTH_ENDPOINT, "/v2/health/ready"),
            health_port=int(number(env.INFERENCE_HEALTH_PORT, port, check=between(1, 65535))),
            health_protocol=choice(env.INFERENCE_HEALTH_PROTOCOL, "http", PROTOCOLS),
            health_expected_status=int(
                number(env.INFERENCE_HEALTH_EXPECTED_RESPONSE_CODE, 200, check=between(100, 599))
            ),
            health_timeout=number(env.INFERENCE_HEALTH_TIMEOUT, 10.0, integer=False, check=positive),
            health_interval=number(WORKER_HEALTH_INTERVAL, 1.0, integer=False, check=positive),
            ready_timeout=number(WORKER_READY_TIMEOUT, 7200.0, integer=False, check=positive),
            max_concurrency=int(number(env.MAX_REQUEST_CONCURRENCY, 1, check=between(1, MAX_CONCURRENCY))),
            own_health_port=int(number(WORKER_HEALTH_PORT, 0, check=between(0, 65535))),
            backend=text(env.BACKEND),
            instance_type=text(env.INSTANCE_TYPE),
            region=text(env.REGION),
            gpu=text(env.GPU_NAME),
            function_type=choice(env.FUNCTION_TYPE, "DEFAULT", FUNCTION_TYPES, upper=True),
            secrets_present=secrets_raw == "true",
            asset_dir=path(WORKER_ASSET_DIR, "/tmp/nvcf-assets"),
            response_dir=path(WORKER_RESPONSE_DIR, "/tmp/nvcf-responses"),
            secrets_file=text(WORKER_SECRETS_FILE) or None,
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
