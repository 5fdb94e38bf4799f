"""``NVCF_TELEMETRY_EXPORTS``: where a workload's telemetry goes, as the control plane writes it for an
instance and its worker (and, for a workload's output, its agent) read it.
"""

from __future__ import annotations

import json

from nvcf_mono.tracing import OtlpTarget

SIGNALS = ("traces", "metrics", "logs")


def exports_problem(raw: str) -> str | None:
    """Why ``raw`` is not ``{"traces"|"metrics"|"logs": {"url", "headers", "networks"}}``, or None."""
    from nvcf_mono.contracts.egress import networks_problem  # here: only a worker with telemetry pays its import

    try:
        parsed = json.loads(raw)
    except ValueError as err:
        return f"must be JSON: {err}"
    if not isinstance(parsed, dict) or not set(parsed) <= set(SIGNALS):
        return f"must be an object keyed by {', '.join(SIGNALS)}"
    for signal, target in parsed.items():
        if not isinstance(target, dict) or not isinstance(target.get("url"), str):
            return f"{signal}: must be an object with a url"
        headers = target.get("headers", {})
        if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
            return f"{signal}: headers must be an object of strings"
        networks = target.get("networks", [])
        if not isinstance(networks, list):
            return f"{signal}: networks must be a list of networks"
        problem = networks_problem(networks)
        if problem:
            return f"{signal}: networks: {problem}"
    return None


def targets(raw: str | None, proxy: str | None = None) -> dict[str, OtlpTarget]:
    """Each signal's receiver (``raw`` checked by :func:`exports_problem` when the worker read it).

    A tenant's endpoint: reached only at public addresses and in the networks the control plane listed
    (none listed: public addresses only); through ``proxy``, the cluster operator's, when one is set.
    """
    if not raw:
        return {}
    return {
        signal: OtlpTarget(
            url=value["url"],
            headers=dict(value.get("headers", {})),
            networks=tuple(value.get("networks", ())),
            proxy=proxy,
        )
        for signal, value in json.loads(raw).items()
    }


def proxy_problem(value: object) -> str | None:
    """Why ``value`` is not an HTTP proxy's URL (``http://host:port``, ``https://...``), or None."""
    from urllib.parse import urlsplit

    text = str(value)
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 - raises for a port out of range
    except ValueError as err:
        return f"{text!r} is not a URL: {err}"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"{text!r} is not an HTTP proxy's URL: give http://host:port (or https://)"
    return None
