"""RFC 7807 problem+json responses, the error format of every HTTP endpoint."""

from __future__ import annotations

import json
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any

from aiohttp import web

from nvcf_mono.errors import NvcfMonoError

PROBLEM_CONTENT_TYPE = "application/problem+json"

_KINDS = {
    400: "bad-request", 401: "unauthorized", 402: "payment-required", 403: "forbidden", 404: "not-found",
    405: "method-not-allowed", 408: "request-timeout", 409: "conflict", 413: "payload-too-large",
    415: "unsupported-media-type", 422: "unprocessable-entity", 429: "too-many-requests",
    500: "internal-server-error", 502: "upstream", 503: "service-unavailable", 504: "gateway-timeout",
}  # fmt: skip


def problem_type(status: int) -> str:
    """NVCF's problem type URN for a status (``urn:nv-boot:problem-details:<kind>``)."""
    return f"urn:nv-boot:problem-details:{_KINDS.get(status, 'error')}"


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


def problem_response(
    status: int,
    detail: str,
    *,
    instance: str | None = None,
    title: str | None = None,
    type_: str | None = None,
    headers: Mapping[str, str] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> web.Response:
    """A problem+json response."""
    body = problem_body(status, detail, instance=instance, title=title, type_=type_, extra=extra)
    return web.Response(
        status=status, body=json.dumps(body).encode(), content_type=PROBLEM_CONTENT_TYPE, headers=headers
    )


class ProblemError(NvcfMonoError):
    """Raise from a handler to answer with problem+json (the error middleware renders it)."""

    def __init__(
        self,
        status: int,
        detail: str,
        *,
        title: str | None = None,
        type_: str | None = None,
        headers: Mapping[str, str] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.title = title
        self.type_ = type_
        self.headers = dict(headers or {})
        self.extra = dict(extra or {})

    def response(self, instance: str | None) -> web.Response:
        """Render as a response for the request at ``instance``."""
        return problem_response(
            self.status,
            self.detail,
            instance=instance,
            title=self.title,
            type_=self.type_,
            headers=self.headers,
            extra=self.extra,
        )
