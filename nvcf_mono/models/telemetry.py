"""Telemetry endpoints (bring your own observability): where a function's traces, metrics and logs go."""

from __future__ import annotations

import enum

from nvcf_mono.models.common import NameValue, max_len
from nvcf_mono.structure import WireModel, checked, wire


class TelemetryProtocol(enum.Enum):
    HTTP = "HTTP"
    GRPC = "GRPC"


class TelemetryProvider(enum.Enum):
    """NVCF's providers; :data:`EXPORTED` says which this platform sends to."""

    PROMETHEUS = "PROMETHEUS"
    GRAFANA_CLOUD = "GRAFANA_CLOUD"
    SPLUNK = "SPLUNK"
    DATADOG = "DATADOG"
    SERVICENOW = "SERVICENOW"
    KRATOS = "KRATOS"
    KRATOS_THANOS = "KRATOS_THANOS"
    TIMESTREAM = "TIMESTREAM"
    VICTORIAMETRICS = "VICTORIAMETRICS"
    AZURE_MONITOR = "AZURE_MONITOR"
    OTEL_COLLECTOR = "OTEL_COLLECTOR"


#: The providers whose endpoints take OTLP over HTTP, and what their secret holds: the platform
#: exports to these alone (the others need vendor exporters it does not have).
EXPORTED: dict[TelemetryProvider, str] = {
    TelemetryProvider.OTEL_COLLECTOR: "the bearer token the collector expects (a string)",
    TelemetryProvider.GRAFANA_CLOUD: 'a JSON object {"instanceId": ..., "apiKey": ...} (basic authentication)',
}


class TelemetryType(enum.Enum):
    LOGS = "LOGS"
    METRICS = "METRICS"
    TRACES = "TRACES"


def _types_check(value: tuple[TelemetryType, ...]) -> str | None:
    return None if value else "must name at least one of LOGS, METRICS, TRACES"


@wire
class Telemetry(WireModel):
    """A telemetry endpoint as returned (its secret never is)."""

    telemetry_id: str
    name: str
    endpoint: str
    protocol: TelemetryProtocol
    provider: TelemetryProvider
    types: tuple[TelemetryType, ...]
    created_at: str


@wire
class StoredTelemetry(WireModel):
    """A telemetry endpoint as stored (bucket ``nvcf_telemetries``, key ``<ncaId>.<telemetryId>``)."""

    telemetry: Telemetry
    nca_id: str
    sealed_secret: str


@wire
class TelemetryRequest(WireModel):
    """Body of ``POST /v2/nvcf/telemetries``; ``secret.name`` names the telemetry."""

    endpoint: str = checked(check=max_len(2048))
    protocol: TelemetryProtocol
    provider: TelemetryProvider
    types: tuple[TelemetryType, ...] = checked(check=_types_check)
    secret: NameValue


@wire
class TelemetrySecretRequest(WireModel):
    """Body of ``PUT /v2/nvcf/secrets/telemetries/{telemetryId}``."""

    secret: NameValue


@wire
class TelemetryResponse(WireModel):
    """``{telemetry}``."""

    telemetry: Telemetry


@wire
class TelemetryListResponse(WireModel):
    """``{telemetries}``."""

    telemetries: tuple[Telemetry, ...]


@wire
class TelemetryIds(WireModel):
    """A function version's or task's ``telemetries``: which endpoint gets each kind of its telemetry."""

    logs_telemetry_id: str | None = None
    metrics_telemetry_id: str | None = None
    traces_telemetry_id: str | None = None

    def chosen(self) -> list[tuple[TelemetryType, str]]:
        """``(type, telemetryId)`` for each kind set."""
        pairs = (
            (TelemetryType.LOGS, self.logs_telemetry_id),
            (TelemetryType.METRICS, self.metrics_telemetry_id),
            (TelemetryType.TRACES, self.traces_telemetry_id),
        )
        return [(kind, tid) for kind, tid in pairs if tid is not None]
