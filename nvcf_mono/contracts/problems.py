"""RFC 7807 problem+json documents, NVCF's error format: what every HTTP endpoint answers with.

The document alone, without a web framework: the worker writes them too, and does not import aiohttp.
"""

from __future__ import annotations

from collections.abc import Mapping
from http import HTTPStatus
from typing import Any

PROBLEM_CONTENT_TYPE = "application/problem+json"

_KINDS = {
    400: "bad-request", 401: "unauthorized", 402: "payment-required", 403: "forbidden", 404: "not-found",
    405: "method-not-allowed", 408: "request-timeout", 409: "conflict", 413: "payload-too-large",
    415: "unsupported-media-type", 422: "unprocessable-entity", 429: "too-many-requests",
    500: "internal-server-error", 502: "upstream", 503: "service-unavailable", 504: "gateway-timeout",
}  # fmt: skip


#: Who wrote a problem, as its type URN says (``urn:<source>:problem-details:<kind>``): the platform's
#: nodes, the worker beside a function, the worker about its connection to the function. A function's
#: own problem+json has a type of its own.
PLATFORM, WORKER_SERVICE, INFERENCE_CONNECTION = "nv-boot", "nvcf-worker-service", "inference-connection"


def from_platform(problem_type_: object) -> bool:
    """Whether a problem's ``type`` says the platform wrote it (its nodes or a worker), not the function."""
    return isinstance(problem_type_, str) and problem_type_.startswith(
        tuple(f"urn:{source}:" for source in (PLATFORM, WORKER_SERVICE, INFERENCE_CONNECTION))
    )


def problem_type(status: int) -> str:
    """NVCF's problem type URN for a status (``urn:nv-boot:problem-details:<kind>``)."""
    return f"urn:{PLATFORM}:problem-details:{_KINDS.get(status, 'error')}"


def reason(status: int) -> str:
    """The HTTP reason phrase."""
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def problem_body(
    status: int,
    detail: str,
    *,
    instance: str | None = None,
    title: str | None = None,
    type_: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The JSON document; absent fields are omitted."""
    doc: dict[str, Any] = {
        "type": type_ or problem_type(status),
        "title": title or reason(status),
        "status": status,
        "detail": detail,
    }
    if instance:
        doc["instance"] = instance
    if extra:
        doc.update(extra)
    return doc
