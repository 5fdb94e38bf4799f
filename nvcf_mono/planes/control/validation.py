"""Request checks beyond field shapes, with NVCF's detail texts (reference control-plane §4)."""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

from nvcf_mono.contracts import tenant_env
from nvcf_mono.http.problem import ProblemError
from nvcf_mono.models.common import KeyValue, NameValue
from nvcf_mono.models.function import CreateFunctionRequest, FunctionType, RateLimit, rate_check
from nvcf_mono.reval.inputs import is_local_chart

SECRET_NAME = re.compile(r"^[a-z0-9A-Z][a-z0-9A-Z_.\-]*$")
RESERVED_PORTS = (8080, 8010)
_CHART_FILE = re.compile(r"^(?P<name>.+?)-(?P<version>\d[^/]*)\.tgz$")


def bad(detail: str) -> ProblemError:
    return ProblemError(400, detail)


def refuse_unsupported(fields: Iterable[tuple[str, Any]]) -> None:
    """Fields of NVCF's schema this platform does not run: a clear 400, never silently ignored."""
    for name, value in fields:
        if value is not None:
            raise bad(
                f"'{name}' is not supported by this platform: it runs container and Helm functions without "
                f"model or resource artifacts; remove '{name}' from the request"
            )


def check_helm_chart_url(url: str) -> None:
    """Scheme, host and network rules of ReVal, plus NVCF's ``.../charts/<name>-<X.Y.Z>.tgz`` shape."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
    except ValueError as err:
        raise bad(f"invalid helm chart URL: {err}") from err
    if parts.scheme not in ("https", "oci"):
        raise bad(f"helm chart URL must use https or oci scheme, got {parts.scheme!r}")
    if not host:
        raise bad("helm chart URL must have a host")
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        address = None
    if address is not None and (address.is_private or address.is_loopback or address.is_link_local):
        raise bad("helm chart URL must not point to private networks")
    path = parts.path
    segments = path.rsplit("/", 2)
    if len(segments) < 3 or segments[-2] != "charts":
        raise bad(
            f"invalid helmChart {url!r}: expected <scheme>://<registry>/<org>[/<team>]/charts/<name>-<version>.tgz"
        )
    m = _CHART_FILE.match(segments[-1])
    if m is None:
        raise bad(f"invalid helmChart {url!r}: the file must be named <name>-<version>.tgz, e.g. echo-1.0.0.tgz")
    if "-" in m["version"]:
        raise bad(f"Helm chart version {m['version']!r} must not contain '-'")
    if "_" in m["name"]:
        raise bad(f"Helm chart name {m['name']!r} must not contain '_'")


def check_secrets(secrets: tuple[NameValue, ...] | None) -> dict[str, Any]:
    """Unique, well-formed names; string or object values up to 32768 characters."""
    out: dict[str, Any] = {}
    for secret in secrets or ():
        if not SECRET_NAME.match(secret.name) or len(secret.name) > 48:
            raise bad(
                f'invalid secret name {secret.name!r}: must match "{SECRET_NAME.pattern}" with at most 48 characters'
            )
        if secret.name in out:
            raise bad(f"duplicate secret name {secret.name!r}")
        if not isinstance(secret.value, str | dict):
            raise bad(f"secret {secret.name!r}: the value must be a string or a JSON object")
        size = len(secret.value) if isinstance(secret.value, str) else len(json.dumps(secret.value))
        if size > 32768:
            raise bad(f"secret {secret.name!r}: the value exceeds 32768 characters")
        out[secret.name] = secret.value
    return out


def check_rate_limit(rate: RateLimit | None) -> None:
    """One of the rates must be set; exemptions need ``rateLimit`` and must not overlap per-NCA rates."""
    if rate is None:
        return
    per_nca = rate.per_nca_id_rate or {}
    if rate.rate_limit is None and not per_nca and rate.per_user_rate is None:
        raise bad("rateLimit needs at least one of 'rateLimit', 'perNcaIdRate' or 'perUserRate'")
    if rate.exempted_nca_ids and rate.rate_limit is None:
        raise bad("'exemptedNcaIds' needs 'rateLimit'")
    if len(per_nca) > 32:
        raise bad("'perNcaIdRate' may name at most 32 accounts")
    for nca, value in per_nca.items():
        problem = rate_check(value)
        if problem:
            raise bad(f"perNcaIdRate[{nca!r}]: {problem}")
    overlap = set(rate.exempted_nca_ids or ()) & set(per_nca)
    if overlap:
        raise bad(f"accounts {sorted(overlap)} are both exempted and given a per-account rate")


def workload_problem(environment: tuple[KeyValue, ...] | None, args: str | None) -> str | None:
    """What the platform's rule (``contracts/tenant_env.py``) refuses in a tenant's environment and arguments."""
    return tenant_env.workload_problem(((kv.key, kv.value) for kv in environment or ()), args)


def check_workload(environment: tuple[KeyValue, ...] | None, args: str | None) -> None:
    """400 for an environment or arguments the platform's rule refuses."""
    problem = workload_problem(environment, args)
    if problem is not None:
        raise bad(problem)


def check_helm_artifact(chart: str, args: object, environment: object, allow_local_charts: bool) -> None:
    """A chart goes without container args and environment; its URL has NVCF's shape (or, in development,
    it is a local chart).
    """
    if args is not None:
        raise bad("Cannot specify both 'containerArgs' and 'helmChart'")
    if environment is not None:
        raise bad("Cannot specify both 'containerEnvironment' and 'helmChart'")
    if not (allow_local_charts and is_local_chart(chart)):
        check_helm_chart_url(chart)


def check_create_function(req: CreateFunctionRequest, *, allow_local_charts: bool = False) -> None:
    """Everything NVCF checks on a new function version that field shapes do not express."""
    refuse_unsupported(
        (("models", req.models), ("resources", req.resources), ("llmInvocationConfig", req.llm_invocation_config))
    )
    if req.function_type is FunctionType.LLM:
        raise bad("functionType 'LLM' is not supported by this platform; use DEFAULT or STREAMING")
    if req.container_image is None and req.helm_chart is None:
        raise bad("One of the following properties 'containerImage', 'models', or 'helmChart' must be specified")
    if req.container_image is not None and req.helm_chart is not None:
        raise bad("Cannot specify both 'containerImage' and 'helmChart'")
    if req.helm_chart is not None:
        if not req.helm_chart_service_name:
            raise bad("'helmChartServiceName' must be specified when 'helmChart' is")
        check_helm_artifact(req.helm_chart, req.container_args, req.container_environment, allow_local_charts)
    elif req.helm_chart_service_name is not None:
        raise bad("'helmChartServiceName' may only be specified with 'helmChart'")
    if req.container_image is not None and not req.container_image.strip():
        raise bad("'containerImage' must not be blank")
    if req.inference_port in RESERVED_PORTS:
        raise bad(f"inferencePort {req.inference_port} is reserved for the platform's worker; use another port")
    if req.health is not None and req.health.port in RESERVED_PORTS:
        raise bad(f"health port {req.health.port} is reserved for the platform's worker; use another port")
    check_workload(req.container_environment, req.container_args)
    check_secrets(req.secrets)
    check_rate_limit(req.rate_limit)
