"""Host-based routing: the function is named by the Host or by headers, and the whole request passes through.

A request carrying ``function-id`` (and optionally ``function-version-id``) headers, or whose Host is
``<fid>.invocation.<domain>`` or ``<vid>.<fid>.invocation.<domain>``, invokes that function with the
client's method, path and query (an empty path becomes ``/``) and body, as NVCF's host router does
before its path router. Auth is pexec's; the default wait is ``plugins.invocation.default_poll_seconds``
whatever the Accept header, no input assets are taken, and the worker's compatibility mode is off, so
the function's answer comes back as it is (as NVCF). Any other request is left to the platform's
routes untouched.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from multidict import CIMultiDict

from nvcf_mono.auth import scopes as S
from nvcf_mono.auth.principal import AuthError
from nvcf_mono.auth.strategy import Authenticator
from nvcf_mono.contracts.frames import COMPATIBILITY_OFF
from nvcf_mono.http.problem import ProblemError
from nvcf_mono.planes.invocation.http import Invocation, Invoker
from nvcf_mono.planes.invocation.intake import poll_seconds
from nvcf_mono.planes.invocation.metrics import Observation

FUNCTION_ID = "function-id"
FUNCTION_VERSION_ID = "function-version-id"
_UUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
_HOST = re.compile(rf"^(?:(?P<vid>{_UUID})\.)?(?P<fid>{_UUID})\.invocation\.", re.IGNORECASE)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _uuid(header: str, value: str) -> str:
    try:
        return str(uuid.UUID(value.strip()))
    except ValueError:
        raise ProblemError(400, f"header {header} must be a function UUID, got {value[:64]!r}") from None


def target(request: web.Request) -> tuple[str, str | None] | None:
    """(function id, version id or None) the request names by header or Host; None for other requests."""
    headers = request.headers
    function_id = headers.get(FUNCTION_ID)
    if function_id is not None:
        version_id = headers.get(FUNCTION_VERSION_ID)
        return (
            _uuid(FUNCTION_ID, function_id),
            None if version_id is None or not version_id.strip() else _uuid(FUNCTION_VERSION_ID, version_id),
        )
    found = _HOST.match(headers.get("Host", ""))
    if found is None:
        return None
    version_id = found["vid"]
    return found["fid"].lower(), None if version_id is None else version_id.lower()


def host_routed(request: web.Request) -> bool:
    """Whether the request names its function by header or Host (without checking the ids it names)."""
    headers = request.headers
    return FUNCTION_ID in headers or _HOST.match(headers.get("Host", "")) is not None


def passthrough_path(request: web.Request) -> str:
    """The client's path and query, verbatim (``/`` for an empty path)."""
    raw = request.raw_path
    return raw if raw.startswith("/") else "/" + raw


def middleware(invoker_of: Callable[[], Invoker], authenticator_of: Callable[[], Authenticator]) -> Any:
    """The aiohttp middleware (added in the plugin's setup; it runs only while the plugin runs)."""

    @web.middleware
    async def route_by_host(request: web.Request, handler: Handler) -> web.StreamResponse:
        named = target(request)
        if named is None:
            return await handler(request)
        function_id, version_id = named
        invoker = invoker_of()

        async def entry(obs: Observation) -> web.StreamResponse:
            try:
                principal = await authenticator_of().authenticate(request.headers.get("Authorization"))
                principal.require(S.INVOKE_FUNCTION)
            except AuthError as err:
                raise ProblemError(err.status, err.detail) from err
            fv = await invoker.routing.resolve_current(principal, function_id, version_id)
            obs.target(fv, principal.account)
            # As NVCF's passthrough: the function's answer comes back as it is (no JSON default, no
            # progress 202, no 302 to a zip), whatever the caller asked.
            headers = CIMultiDict(request.headers)
            headers[COMPATIBILITY_OFF] = "true"  # replaces every copy the caller sent, in any case
            return await invoker.handle(
                request,
                principal,
                fv,
                Invocation(
                    method=request.method,
                    path=passthrough_path(request),
                    headers=headers,
                    poll=poll_seconds(invoker.config, headers, streaming=False),
                ),
            )

        return await invoker.observed(entry)

    return route_by_host
