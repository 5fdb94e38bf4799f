"""A function version as NVCF shows it (``FunctionDto``) and as it is stored (bucket ``nvcf_functions``)."""

from __future__ import annotations

import enum
import re
from collections.abc import Iterator
from typing import Any

from nvcf_mono.models.common import (
    KeyValue,
    NameValue,
    image_reference,
    int_range,
    iso_duration_at_most,
    max_items,
    max_len,
    name_check,
    url_path,
)
from nvcf_mono.models.telemetry import TelemetryIds
from nvcf_mono.structure import WireModel, checked, described, wire


class FunctionStatus(enum.Enum):
    """Status of a function version (reference control-plane §3.1)."""

    ACTIVE = "ACTIVE"
    DEPLOYING = "DEPLOYING"
    ERROR = "ERROR"
    INACTIVE = "INACTIVE"
    DELETED = "DELETED"
    DEGRADED = "DEGRADED"
    DEGRADING = "DEGRADING"


#: Versions the invocation plane may send requests to.
INVOCABLE = frozenset({FunctionStatus.ACTIVE, FunctionStatus.DEGRADING})
#: Versions whose requests wait in the queue for an instance that is starting or coming back.
AWAITING_INSTANCES = frozenset({FunctionStatus.DEPLOYING, FunctionStatus.DEGRADED})
#: Versions whose workers may connect (ConnectOnce); others are zombies.
CONNECTABLE = frozenset(
    {FunctionStatus.ACTIVE, FunctionStatus.DEPLOYING, FunctionStatus.DEGRADED, FunctionStatus.DEGRADING}
)


class FunctionType(enum.Enum):
    """How a function is invoked."""

    DEFAULT = "DEFAULT"
    STREAMING = "STREAMING"
    LLM = "LLM"


class ApiBodyFormat(enum.Enum):
    """The request body convention of the inference server."""

    CUSTOM = "CUSTOM"
    PREDICT_V2 = "PREDICT_V2"


class HealthProtocol(enum.Enum):
    """How the worker checks the inference server."""

    HTTP = "HTTP"
    GRPC = "gRPC"


DEFAULT_HEALTH_URI = "/v2/health/ready"
DEFAULT_INFERENCE_PORT = 8000
DEFAULT_HEALTH_TIMEOUT = "PT10S"
GRPC_INFERENCE_URL = "/grpc"

_TAG_RX = re.compile(r"[a-zA-Z0-9\-_:=]+")
_RATE_RX = re.compile(r"^(?!.*-([SMHD]).*-\1)[1-9]\d*-[SMHD](,\s*[1-9]\d*-[SMHD])*$")


def _tags_check(tags: tuple[str, ...] | None) -> str | None:
    if tags is None:
        return None
    if len(tags) > 64:
        return "size must be between 0 and 64"
    for tag in tags:
        if len(tag) > 128:
            return f"tag {tag[:32]!r}... is longer than 128 characters"
        if not _TAG_RX.fullmatch(tag):
            return f'tag {tag!r} must match "[a-zA-Z0-9\\-_:=]+"'
    return None


#: At most 64 tags of at most 128 characters from ``[a-zA-Z0-9-_:=]``.
tags_check = described(_tags_check, maxItems=64, items={"maxLength": 128, "pattern": r"^[a-zA-Z0-9\-_:=]+$"})


def rate_check(value: str | None) -> str | None:
    """Comma-separated ``N-[SMHD]`` rates, each unit at most once (``100-S,5000-M``)."""
    if value is None or _RATE_RX.match(value):
        return None
    return f"invalid rate {value!r}: use comma-separated N-S, N-M, N-H or N-D (each unit at most once)"


def parse_rates(value: str) -> list[tuple[int, float]]:
    """``"10-S,500-M"`` -> ``[(10, 1.0), (500, 60.0)]`` (count, window in seconds)."""
    windows = {"S": 1.0, "M": 60.0, "H": 3600.0, "D": 86400.0}
    out = []
    for part in value.split(","):
        count, unit = part.strip().split("-")
        out.append((int(count), windows[unit.upper()]))
    return out


@wire
class Health(WireModel):
    """The inference server's health check; every field is required when the object is given, except
    that a gRPC check (the grpc.health.v1 protocol) needs no ``uri`` or ``expectedStatusCode``.
    """

    protocol: HealthProtocol
    port: int = checked(check=int_range(1, 65535))
    #: One check's time limit: up to ten minutes (a longer wait is a startup timeout, not a health check).
    timeout: str = checked(check=iso_duration_at_most("PT10M"))
    #: The path the worker checks (HTTP), or the service name of grpc.health.v1 (none: the whole server).
    uri: str | None = checked(None, check=max_len(2048))
    expected_status_code: int | None = checked(None, check=int_range(100, 599))

    def __checks__(self) -> Iterator[tuple[str, str]]:
        if self.protocol is not HealthProtocol.HTTP:
            return
        if self.uri is None:
            yield "uri", "required for an HTTP health check"
        elif (problem := url_path(self.uri)) is not None:
            yield "uri", problem
        if self.expected_status_code is None:
            yield "expectedStatusCode", "required for an HTTP health check"

    @property
    def path(self) -> str:
        """What the worker checks: the HTTP path, or the gRPC service name ("" for the whole server)."""
        return self.uri or ""

    @property
    def expected(self) -> int:
        """The HTTP status a healthy server answers (a gRPC check looks for SERVING instead)."""
        return self.expected_status_code or 200


@wire
class RateLimit(WireModel):
    """Invocation rate limits of a function version (reference control-plane §2.1)."""

    rate_limit: str | None = checked(None, check=rate_check)
    exempted_nca_ids: tuple[str, ...] | None = checked(None, check=max_items(32))
    per_nca_id_rate: dict[str, str] | None = None
    sync_check: bool | None = None
    per_user_rate: str | None = checked(None, check=rate_check)


@wire
class InstanceInfo(WireModel):
    """One running instance of a version (``activeInstances``)."""

    instance_id: str
    function_id: str
    function_version_id: str
    instance_type: str
    instance_status: str
    icms_request_id: str
    nca_id: str
    gpu: str
    backend: str
    location: str | None = None
    instance_created_at: str | None = None
    instance_updated_at: str | None = None


@wire
class FunctionVersion(WireModel):
    """A function version: what is stored and, with owner-only fields filtered, what is returned."""

    id: str
    nca_id: str
    version_id: str
    name: str
    status: FunctionStatus
    created_at: str
    #: Omitted (None) only in views for accounts the function is shared with.
    inference_url: str | None = None
    inference_port: int | None = None
    container_image: str | None = None
    container_args: str | None = None
    container_environment: tuple[KeyValue, ...] | None = None
    helm_chart: str | None = None
    helm_chart_service_name: str | None = None
    health: Health | None = None
    health_uri: str | None = None
    api_body_format: ApiBodyFormat = ApiBodyFormat.CUSTOM
    function_type: FunctionType = FunctionType.DEFAULT
    description: str | None = None
    tags: tuple[str, ...] | None = None
    secrets: tuple[str, ...] | None = None
    rate_limit: RateLimit | None = None
    telemetries: TelemetryIds | None = None
    owned_by_different_account: bool | None = None
    active_instances: tuple[InstanceInfo, ...] | None = None

    @property
    def is_grpc(self) -> bool:
        """``inferenceUrl: /grpc`` marks a gRPC function."""
        return self.inference_url == GRPC_INFERENCE_URL

    @property
    def is_helm(self) -> bool:
        return self.helm_chart is not None

    def effective_health(self) -> Health:
        """The health check the worker runs, with NVCF's defaults filled in."""
        if self.health is not None:
            return self.health
        return Health(
            protocol=HealthProtocol.GRPC if self.is_grpc else HealthProtocol.HTTP,
            uri=self.health_uri or DEFAULT_HEALTH_URI,
            port=self.inference_port or DEFAULT_INFERENCE_PORT,
            timeout=DEFAULT_HEALTH_TIMEOUT,
            expected_status_code=200,
        )


@wire
class CreateFunctionRequest(WireModel):
    """Body of ``POST /v2/nvcf/functions`` and ``POST /v2/nvcf/functions/{fid}/versions``."""

    name: str = checked(check=name_check)
    inference_url: str = checked(check=url_path)
    inference_port: int | None = checked(None, check=int_range(1, 65535))
    container_image: str | None = checked(None, check=image_reference)
    container_args: str | None = checked(None, check=max_len(8192))
    container_environment: tuple[KeyValue, ...] | None = checked(None, check=max_items(256))
    helm_chart: str | None = checked(None, check=max_len(1024))
    helm_chart_service_name: str | None = checked(None, check=max_len(253))
    health: Health | None = None
    health_uri: str | None = checked(None, check=url_path)
    api_body_format: ApiBodyFormat | None = None
    function_type: FunctionType | None = None
    description: str | None = checked(None, check=max_len(256))
    tags: tuple[str, ...] | None = checked(None, check=tags_check)
    secrets: tuple[NameValue, ...] | None = None
    rate_limit: RateLimit | None = None
    telemetries: TelemetryIds | None = None
    # Accepted in NVCF's schema but not run by this platform: present means a clear 400.
    models: Any = None
    resources: Any = None
    llm_invocation_config: Any = None


@wire
class UpdateFunctionRequest(WireModel):
    """Body of ``PUT /v2/nvcf/functions/{fid}/versions/{vid}``: metadata only."""

    tags: tuple[str, ...] | None = checked(None, check=tags_check)
    rate_limit: RateLimit | None = None
    description: str | None = checked(None, check=max_len(256))
    model_updates: Any = None
    llm_invocation_config: Any = None


@wire
class FunctionResponse(WireModel):
    """``{function}``."""

    function: FunctionVersion


@wire
class FunctionListResponse(WireModel):
    """``{functions}``."""

    functions: tuple[FunctionVersion, ...]


@wire
class FunctionIdsResponse(WireModel):
    """``{functionIds}``."""

    function_ids: tuple[str, ...]
