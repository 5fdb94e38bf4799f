"""RFC 7807 problem+json responses, the error format of every HTTP endpoint."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from nvcf_mono.contracts.problems import PROBLEM_CONTENT_TYPE, problem_body
from nvcf_mono.errors import NvcfMonoError


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
