"""The worker's settings, read from the instance environment contract (``contracts/env.py``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal, TypeVar

import attrs

from nvcf_mono.contracts import env
from nvcf_mono.contracts.telemetry import exports_problem, proxy_problem
from nvcf_mono.errors import NvcfMonoError
from nvcf_mono.structure import (
    KEY,
    Check,
    StructureError,
    Text,
    at_least,
    checked,
    in_range,
    optional,
    positive,
    structure,
)
from nvcf_mono.worker import endpoint

Protocol = Literal["http", "grpc"]
FunctionType = Literal["DEFAULT", "STREAMING", "LLM"]
#: NVCF's API caps maxRequestConcurrency at this.
MAX_CONCURRENCY = 16384


class WorkerConfigError(NvcfMonoError):
    """The environment does not describe an instance the worker can serve."""


def host_port(value: str) -> str | None:
    return None if endpoint.parse(value) is not None else f"must be host:port, got {value!r}"


def absolute(value: str) -> str | None:
    return None if value.startswith("/") else f"must be a path starting with '/', got {value!r}"


C = TypeVar("C")


def from_contract(cls: type[C], environ: Mapping[str, str]) -> C:
    """An attrs settings class read from the variables its fields name (``contract(...)``).

    Blank counts as unset; every problem is one line of the :class:`WorkerConfigError`.
    """
    data: dict[str, Text] = {}
    for field in attrs.fields(cls):  # type: ignore[arg-type]
        key = field.metadata.get(KEY)
        if key is None:
            continue
        names = (key, *_FALLBACKS.get(key, ()))
        raw = next((v for v in (environ.get(name, "").strip() for name in names) if v), "")
        if raw:
            data[key] = Text(_NORMALIZE.get(key, str)(raw))
    try:
        return structure(cls, data)
    except StructureError as err:
        raise WorkerConfigError(str(err)) from None


def contract(key: str, default: Any = attrs.NOTHING, check: Check | None = None) -> Any:
    """A setting read from the contract variable ``key``."""
    return checked(default, key=key, check=check)


PORT = in_range(1, 65535)


@attrs.frozen(kw_only=True)
class WorkerConfig:
    """Everything the worker needs to know about its instance; each setting names the variable it is read from."""

    worker_token: str = contract(env.NVCF_WORKER_TOKEN)
    grpc_address: str = contract(env.NVCF_FQDN_GRPC, check=host_port)
    grpc_tls: bool = contract(env.NVCF_FQDN_GRPC_TLS, False)
    grpc_ca: str | None = contract(env.NVCF_FQDN_GRPC_CA, None)
    function_id: str = contract(env.FUNCTION_ID)
    function_version_id: str = contract(env.FUNCTION_VERSION_ID)
    function_name: str = contract(env.FUNCTION_NAME, "")
    nca_id: str = contract(env.NCA_ID, "")
    instance_id: str = contract(env.INSTANCE_ID, "instance")
    inference_host: str = contract(env.INFERENCE_HOST, "127.0.0.1")
    inference_port: int = contract(env.INFERENCE_PORT, 8000, PORT)
    inference_url: str = contract(env.INFERENCE_URL, "/", absolute)
    inference_protocol: Protocol = contract(env.INFERENCE_PROTOCOL, "http")
    health_endpoint: str = contract(env.INFERENCE_HEALTH_ENDPOINT, "/v2/health/ready")
    health_port: int = contract(
        env.INFERENCE_HEALTH_PORT, attrs.Factory(lambda self: self.inference_port, takes_self=True), PORT
    )
    health_protocol: Protocol = contract(env.INFERENCE_HEALTH_PROTOCOL, "http")
    health_expected_status: int = contract(env.INFERENCE_HEALTH_EXPECTED_RESPONSE_CODE, 200, in_range(100, 599))
    health_timeout: float = contract(env.INFERENCE_HEALTH_TIMEOUT, 10.0, positive)
    health_interval: float = contract(env.WORKER_HEALTH_INTERVAL, 1.0, positive)
    ready_timeout: float = contract(env.INFERENCE_READY_TIMEOUT, 7200.0, positive)
    max_concurrency: int = contract(env.MAX_REQUEST_CONCURRENCY, 1, in_range(1, MAX_CONCURRENCY))
    own_health_port: int = contract(env.HEALTH_PORT, 0, in_range(0, 65535))
    backend: str = contract(env.BACKEND, "")
    instance_type: str = contract(env.INSTANCE_TYPE, "")
    region: str = contract(env.REGION, "")
    gpu: str = contract(env.GPU_NAME, "")
    function_type: FunctionType = contract(env.FUNCTION_TYPE, "DEFAULT")
    secrets_present: bool = contract(env.FUNCTION_SECRETS_PRESENT, False)
    asset_dir: str = contract(env.BASE_ASSET_DIR, "/tmp/nvcf-assets", absolute)
    response_dir: str = contract(env.BASE_RESPONSE_DIR, "/tmp/nvcf-responses", absolute)
    #: The same directories where the inference server sees them (a container backend mounts them elsewhere).
    inference_asset_dir: str = contract(env.INFERENCE_ASSET_DIR, "/tmp/nvcf-assets", absolute)
    inference_response_dir: str = contract(env.INFERENCE_RESPONSE_DIR, "/tmp/nvcf-responses", absolute)
    secrets_file: str | None = contract(env.SECRETS_FILE, None)
    secrets_refresh: float = contract(env.SECRETS_REFRESH_INTERVAL, 10.0, at_least(0))
    #: A file the agent keeps the platform's current address in (read before each connection).
    grpc_address_file: str | None = contract(env.NVCF_FQDN_GRPC_FILE, None)
    #: The OTLP/HTTP collector this worker sends its spans to (None: no tracing).
    traces_endpoint: str | None = contract(env.NVCF_TRACES_ENDPOINT, None)
    #: The function's own telemetry receivers (``worker/telemetry.py``).
    telemetry_exports: str | None = contract(env.NVCF_TELEMETRY_EXPORTS, None, optional(exports_problem))
    #: The operator's proxy to those receivers.
    telemetry_proxy: str | None = contract(env.NVCF_TELEMETRY_PROXY, None, optional(proxy_problem))
    # Not from the environment:
    frame_size: int = 256 * 1024
    #: How often a running request's progress file is looked at.
    progress_interval: float = 0.1

    @property
    def inference_base(self) -> str:
        return f"http://{self.inference_host}:{self.inference_port}"

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> WorkerConfig:
        """Read the contract; every problem in one error, one line each."""
        return from_contract(cls, environ)


#: Where a setting is read from when its own variable is unset, in order.
_FALLBACKS = {
    env.INSTANCE_ID: (env.NVCF_INSTANCE_ID, env.ICMS_REQUEST_ID),
    # A Helm function's inference server is its Service, unless the agent says otherwise.
    env.INFERENCE_HOST: (env.HELM_CHART_INFERENCE_SERVICE_NAME,),
    env.INFERENCE_ASSET_DIR: (env.BASE_ASSET_DIR,),
    env.INFERENCE_RESPONSE_DIR: (env.BASE_RESPONSE_DIR,),
}
#: Values compared without regard to case.
_NORMALIZE: dict[str, Callable[[str], str]] = {
    env.INFERENCE_PROTOCOL: str.lower,
    env.INFERENCE_HEALTH_PROTOCOL: str.lower,
    env.FUNCTION_TYPE: str.upper,
    env.FUNCTION_SECRETS_PRESENT: str.lower,
    env.NVCF_FQDN_GRPC_TLS: str.lower,
}
