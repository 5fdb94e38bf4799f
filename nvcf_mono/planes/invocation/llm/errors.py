"""Errors in OpenAI's shape, so OpenAI's client libraries raise their usual exceptions.

``{"error": {"message", "type", "param", "code"}}`` with the status the client maps: 400
``BadRequestError``, 401 ``AuthenticationError``, 403 ``PermissionDeniedError``, 404 ``NotFoundError``,
429 ``RateLimitError`` (with ``Retry-After``), 5xx ``InternalServerError``.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping

from aiohttp import web

from nvcf_mono.contracts.problems import PROBLEM_CONTENT_TYPE, from_platform
from nvcf_mono.planes.invocation.llm.shallow import NotJson, ShallowObject

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
}
_CODES = {401: "invalid_api_key", 404: "model_not_found", 429: "rate_limit_exceeded"}


class _Code(enum.Enum):
    BY_STATUS = "the code OpenAI gives that status (model_not_found for a 404)"


BY_STATUS = _Code.BY_STATUS
#: Headers of a platform answer that stay on its OpenAI-shaped twin.
_KEPT = ("Retry-After", "NVCF-REQID", "NVCF-STATUS", "X-Request-ID")


class GatewayError(Exception):
    """Raise in the gateway to answer with an OpenAI error."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | _Code | None = BY_STATUS,
        param: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.headers = dict(headers or {})

    def response(self) -> web.Response:
        headers = own_error_headers(self.status, self.headers)
        return error_response(self.status, self.message, code=self.code, param=self.param, headers=headers)


def error_response(
    status: int,
    message: str,
    *,
    code: str | _Code | None = BY_STATUS,
    param: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> web.Response:
    """``code`` None is OpenAI's null (an unknown URL has no code); left out, the status picks it."""
    kind = _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    if isinstance(code, _Code):
        code = _CODES.get(status)
    doc = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return web.Response(status=status, body=json.dumps(doc).encode(), content_type="application/json", headers=headers)


def own_error_headers(status: int, headers: Mapping[str, str]) -> dict[str, str]:
    """The headers of an error the gateway or the platform answers itself (not the function): a 5xx
    without ``Retry-After`` also says ``x-should-retry: false``. What passes is marked with
    ``Retry-After`` (a bus or store not taking the call, the gateway starting); otherwise the platform
    has done its own retrying (a version in ERROR, a request given up after its deliveries, one past
    its queue deadline, an answer that did not start within ``wait_seconds`` and goes on), so OpenAI's
    clients, which resend a 5xx twice by default, would only queue the same inference again.
    """
    kept = dict(headers)
    if status >= 500 and "Retry-After" not in kept:
        kept["x-should-retry"] = "false"
    return kept


def platform_problem(status: int, detail: str, headers: Mapping[str, str]) -> web.Response:
    """The platform's own refusal or failure in OpenAI's shape."""
    return error_response(status, detail, headers=own_error_headers(status, headers))


#: How much of a function's own error answer its OpenAI-shaped twin quotes.
QUOTED = 500


def in_openai_shape(response: web.Response) -> web.Response:
    """An error answer, not yet sent, in OpenAI's shape; a success, or an error already in it, unchanged.

    The platform's problem+json (its ``type`` says so: the platform's nodes or a worker wrote it) gives
    its ``detail``. A function's error that is not OpenAI-shaped (a server's plain "404: Not Found", a
    web framework's ``{"detail": ...}``, its own problem+json) is quoted, so a client's exception says
    what went wrong rather than nothing, and only the platform's own 5xx say ``x-should-retry: false``.
    """
    if response.prepared or response.status < 400:
        return response
    body = response.body if isinstance(response.body, bytes) else b""
    try:
        doc = ShallowObject.parse(body) if body else None  # one level deep: it is the function's answer
    except NotJson:
        doc = None
    headers = {k: response.headers[k] for k in _KEPT if k in response.headers}
    if response.content_type == PROBLEM_CONTENT_TYPE and doc is not None and from_platform(doc.get("type")):
        detail = doc.get("detail", "")
        return platform_problem(response.status, str(detail or response.reason), headers)
    if doc is not None and "error" in doc:
        return response  # OpenAI's shape already (vLLM, NIM, the example)
    said = doc.get("detail") or doc.get("message") if doc is not None else None
    text = str(said) if said else body.decode("utf-8", "replace").strip()
    message = f"the model's server answered {response.status}" + (f": {text[:QUOTED]}" if text else "")
    return error_response(response.status, message, headers=headers)
