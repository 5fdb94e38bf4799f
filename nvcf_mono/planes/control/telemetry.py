"""Telemetry endpoints: the checks the API makes, the functions using one, and what an instance exports to.

An instance's telemetry goes out over OTLP/HTTP (as NVCF's collector sends it), by three routes:

- the function's own OpenTelemetry SDK, through the standard ``OTEL_EXPORTER_OTLP_<SIGNAL>_*``
  variables the platform puts in its environment (a variable the function sets itself wins);
- the worker beside it, which sends its spans of every invocation (the function's spans join them
  through ``traceparent``), the instance's request metrics and its own log (``worker/telemetry.py``);
- the cluster agent (local and containers backends), which sends what the workload prints
  (``planes/compute/log_shipping.py``).
"""

from __future__ import annotations

import json
from base64 import b64encode
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import quote, urlsplit

import anyio

from nvcf_mono import tracing
from nvcf_mono.auth.secret import Keyring
from nvcf_mono.contracts import buckets, trace
from nvcf_mono.contracts.egress import Network, host_refusal
from nvcf_mono.http.problem import ProblemError
from nvcf_mono.models.common import NameValue, is_uuid
from nvcf_mono.models.function import FunctionVersion
from nvcf_mono.models.task import TERMINAL, Task
from nvcf_mono.models.telemetry import (
    EXPORTED,
    StoredTelemetry,
    TelemetryIds,
    TelemetryProvider,
    TelemetryType,
)
from nvcf_mono.planes.control.store import ControlStore
from nvcf_mono.planes.control.validation import SECRET_NAME

#: Seconds a registration waits for its endpoint's name to resolve (after that, it is checked when used).
RESOLVE_WITHIN = 2.0
#: The path OTLP/HTTP receivers take each signal on, after the endpoint's own path.
SIGNAL_PATHS = {TelemetryType.TRACES: "v1/traces", TelemetryType.METRICS: "v1/metrics", TelemetryType.LOGS: "v1/logs"}


def endpoint_problem(endpoint: str) -> str | None:
    """Why ``endpoint`` is no OTLP/HTTP base URL, or None (where it points is :func:`address_problem`'s)."""
    try:
        parts = urlsplit(endpoint.strip())
        host = parts.hostname
        parts.port  # noqa: B018 - raises ValueError for a port out of range
    except ValueError as err:
        return f"endpoint {endpoint!r} is not a URL: {err}"
    if parts.scheme not in ("http", "https") or not host:
        return (
            f"endpoint {endpoint!r} must be an http:// or https:// URL with a host (the base URL of an OTLP/HTTP "
            "receiver; /v1/traces, /v1/metrics and /v1/logs are added to it)"
        )
    if parts.query or parts.fragment or parts.username is not None:
        return f"endpoint {endpoint!r} must not carry a query, fragment or user name (the secret holds credentials)"
    return None


async def address_problem(endpoint: str, networks: Sequence[Network]) -> str | None:
    """Why the platform does not send to ``endpoint``'s host (an IP address it refuses, or a name that
    resolves only to such addresses), or None.

    Only a first answer for the one who registers it: a name that does not resolve (yet) here is
    accepted, and the worker and the agent check every address again when they connect.
    """
    host = urlsplit(endpoint.strip()).hostname or ""
    reason = None
    with anyio.move_on_after(RESOLVE_WITHIN):
        reason = await host_refusal(host, networks)
    if reason is None:
        return None
    return (
        f"endpoint {endpoint!r}: {reason}; telemetry is sent from the platform's side, to public addresses and to "
        "the networks its operator lists in plugins.control.telemetry_networks"
    )


def export_problem() -> str | None:
    """Why this platform cannot send telemetry at all, or None (its workers run from the same install)."""
    if tracing.installed():
        return None
    return (
        "this platform cannot send telemetry: OpenTelemetry is not installed (its operator installs it with "
        "pip install 'nvcf-mono[otel]'; `make up` and the product image have it)"
    )


def provider_problem(provider: TelemetryProvider) -> str | None:
    if provider in EXPORTED:
        return None
    supported = "; ".join(f"{p.value} (secret: {what})" for p, what in EXPORTED.items())
    return (
        f"provider {provider.value!r} is not supported by this platform: it exports telemetry over OTLP/HTTP, "
        f"to {supported}"
    )


def secret_problem(provider: TelemetryProvider, secret: NameValue) -> str | None:
    """Why ``secret`` cannot authenticate to ``provider``'s endpoint, or None."""
    if not SECRET_NAME.match(secret.name) or len(secret.name) > 48:
        return (
            f'invalid secret.name {secret.name!r}: must match "{SECRET_NAME.pattern}" with at most 48 characters '
            "(it names the telemetry)"
        )
    value = secret.value
    if len(json.dumps(value)) > 8192:
        return "secret.value exceeds 8192 characters"
    if provider is TelemetryProvider.GRAFANA_CLOUD:
        if not isinstance(value, dict) or set(value) != {"instanceId", "apiKey"}:
            return 'secret.value for GRAFANA_CLOUD must be a JSON object {"instanceId": ..., "apiKey": ...}'
        if not all(isinstance(v, str | int) and str(v).strip() for v in value.values()):
            return "secret.value for GRAFANA_CLOUD: instanceId and apiKey must be non-empty"
        return _printable(value.values())
    if not isinstance(value, str) or not value.strip():
        return f"secret.value for {provider.value} must be a non-empty string (the bearer token)"
    return _printable([value])


def _printable(values: Iterable[object]) -> str | None:
    # A credential ends up in an HTTP header: no control characters (a newline would start another header).
    if any(not str(v).isprintable() for v in values):
        return "secret.value must not contain control characters (it is sent in an HTTP header)"
    return None


def seal_secret(keyring: Keyring, key: str, secret: NameValue) -> str:
    return keyring.box.seal(json.dumps(secret.value).encode(), aad=key)


async def owned(store: ControlStore, nca_id: str, telemetry_id: str) -> StoredTelemetry | None:
    """The account's telemetry ``telemetry_id``, or None (another account's is as absent as a missing one)."""
    if not is_uuid(telemetry_id):
        return None
    return await store.telemetries.fetch(buckets.account_item_key(nca_id, telemetry_id))


def not_found(nca_id: str, telemetry_id: str) -> ProblemError:
    return ProblemError(404, f"Account '{nca_id}' Telemetry '{telemetry_id}': Not found")


async def check_chosen(store: ControlStore, nca_id: str, chosen: TelemetryIds | None) -> None:
    """At least one id; each an endpoint of the account that takes that kind of telemetry."""
    if chosen is None:
        return
    pairs = chosen.chosen()
    if not pairs:
        raise ProblemError(
            400,
            "Invalid request: Telemetry object must have at least one UUID specified "
            "(logsTelemetryId, metricsTelemetryId or tracesTelemetryId)",
        )
    for kind, tid in pairs:
        stored = await owned(store, nca_id, tid)
        if stored is None:
            raise not_found(nca_id, tid)
        if kind not in stored.telemetry.types:
            takes = ", ".join(t.value for t in stored.telemetry.types)
            raise ProblemError(
                400,
                f"Invalid telemetry type: telemetry '{tid}' ({stored.telemetry.name}) takes {takes}, "
                f"not {kind.value}; choose one that takes {kind.value} as {kind.value.lower()}TelemetryId",
            )


def users_of(store: ControlStore, nca_id: str, telemetry_id: str) -> list[str]:
    """What of the account sends telemetry to ``telemetry_id``: its function versions, and its tasks not
    yet finished (a finished one sends nothing more).
    """

    def uses(chosen: TelemetryIds | None) -> bool:
        return chosen is not None and telemetry_id in (tid for _, tid in chosen.chosen())

    versions = [
        f"Function id '{fv.id}', version '{fv.version_id}'"
        for fv in store.functions.values()
        if fv.nca_id == nca_id and uses(fv.telemetries)
    ]
    tasks = [
        f"Task id '{t.id}' ({t.status.value})"
        for t in store.tasks.values()
        if t.nca_id == nca_id and t.status not in TERMINAL and uses(t.telemetries)
    ]
    return versions + tasks


def _headers(provider: TelemetryProvider, secret: Any) -> dict[str, str]:
    if provider is TelemetryProvider.GRAFANA_CLOUD:
        pair = f"{secret['instanceId']}:{secret['apiKey']}".encode()
        return {"Authorization": "Basic " + b64encode(pair).decode()}
    return {"Authorization": f"Bearer {secret}"}


def exports_of(
    store: ControlStore, keyring: Keyring, nca_id: str, chosen: TelemetryIds | None, networks: Sequence[str]
) -> dict[str, dict[str, Any]]:
    """Where each kind of a version's or task's telemetry goes: ``{"traces": {"url", "headers", "name",
    "provider", "networks"}, ...}`` (``networks``: the non-public ones it may reach, the operator's
    ``telemetry_networks``).

    A telemetry deleted or no longer opened with this platform's secret is left out (the workload runs
    without it: a missing signal, nothing worse).
    """
    out: dict[str, dict[str, Any]] = {}
    for kind, tid in chosen.chosen() if chosen is not None else ():
        key = buckets.account_item_key(nca_id, tid)
        stored = store.telemetries.get(key)
        if stored is None or kind not in stored.telemetry.types:
            continue
        try:
            secret = json.loads(keyring.box.open(stored.sealed_secret, aad=key))
        except ValueError:
            continue
        tel = stored.telemetry
        out[kind.value.lower()] = {
            "url": f"{tel.endpoint.strip().rstrip('/')}/{SIGNAL_PATHS[kind]}",
            "headers": _headers(tel.provider, secret),
            "name": tel.name,
            "provider": tel.provider.value,
            "networks": list(networks),
        }
    return out


def sdk_environment(
    service: str, attributes: Sequence[tuple[str, str]], exports: Mapping[str, Mapping[str, Any]]
) -> list[dict[str, str]]:
    """The standard OpenTelemetry SDK variables that send a workload's own telemetry where ``exports`` say,
    as ``service`` with resource ``attributes``.
    """
    if not exports:
        return []
    values = {
        "OTEL_SERVICE_NAME": service,
        "OTEL_RESOURCE_ATTRIBUTES": ",".join(f"{k}={quote(v, safe='')}" for k, v in attributes),
    }
    exporters = {"traces": "OTEL_TRACES_EXPORTER", "metrics": "OTEL_METRICS_EXPORTER", "logs": "OTEL_LOGS_EXPORTER"}
    for signal, variable in exporters.items():
        target = exports.get(signal)
        if target is None:
            values[variable] = "none"  # no endpoint for it: the SDK's default (localhost:4318) would only fail
            continue
        values[variable] = "otlp"
        prefix = f"OTEL_EXPORTER_OTLP_{signal.upper()}_"
        values[prefix + "ENDPOINT"] = target["url"]
        values[prefix + "PROTOCOL"] = "http/protobuf"
        values[prefix + "HEADERS"] = ",".join(f"{k}={quote(v, safe='')}" for k, v in target["headers"].items())
    return [{"key": k, "value": v} for k, v in values.items()]


def function_environment(fv: FunctionVersion, exports: Mapping[str, Mapping[str, Any]]) -> list[dict[str, str]]:
    """:func:`sdk_environment` for an instance of ``fv``."""
    ids = ((trace.FUNCTION_ID, fv.id), (trace.FUNCTION_VERSION_ID, fv.version_id), (trace.NCA_ID, fv.nca_id))
    return sdk_environment(fv.name, ids, exports)


def task_environment(task: Task, exports: Mapping[str, Mapping[str, Any]]) -> list[dict[str, str]]:
    """:func:`sdk_environment` for ``task``'s instance."""
    return sdk_environment(task.name, ((trace.TASK_ID, task.id), (trace.NCA_ID, task.nca_id)), exports)


def worker_exports(exports: Mapping[str, Mapping[str, Any]]) -> str:
    """``NVCF_TELEMETRY_EXPORTS``: each signal's receiver and credentials, as the worker reads them."""
    return json.dumps(
        {signal: {"url": t["url"], "headers": t["headers"], "networks": t["networks"]} for signal, t in exports.items()}
    )
