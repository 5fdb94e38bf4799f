"""Cross-origin calls to the invocation routes, as NVCF's invocation service allows them.

A web page on any origin may call pexec and exec, poll their status and download a large response
from the browser: a preflight (any ``OPTIONS`` on those routes) is answered 200 before any
authentication, echoing the origin, method and headers it asked for, with credentials allowed and
a one-day max age; an actual call's answer (errors included) names the origin back. Every answer
that carries ``NVCF-REQID`` lets the page read it (``Access-Control-Expose-Headers``, after whatever
the function exposed itself).

Echoing any origin with credentials is safe here only because the platform has no ambient
credentials: it reads a bearer token from the ``Authorization`` header, never a cookie, so a page can
only call with a key it already holds.

Host-routed calls (``function-id`` header or ``<fid>.invocation.`` Host) get no CORS handling: their
``OPTIONS`` reaches the function, whose answer is its own, as in NVCF.

The LLM gateway's routes, where it runs, are open to pages the same way (OpenAI's API and vLLM's
server are): a chat page in a browser calls ``/v1/chat/completions`` with its user's key.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, final

from aiohttp import web

from nvcf_mono.planes.invocation.answers import REQID
from nvcf_mono.planes.invocation.host_routing import host_routed

#: The invocation routes' paths start so (pexec, exec and their status polls).
PREFIXES = ("/v2/nvcf/pexec/", "/v2/nvcf/exec/")
#: How long a browser may keep a preflight's answer (NVCF's one day).
MAX_AGE = "86400"
#: What a cross-origin answer varies by (a cache must not give one origin's answer to another).
VARY = "Origin, Access-Control-Request-Method, Access-Control-Request-Headers"
#: Answer headers a page may read when present: the request's id, and the gateway's request and
#: conversation ids (sent back with a conversation's next turn).
EXPOSED = (REQID.lower(), "x-request-id", "x-multi-turn-session-id")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _allowed_methods(path: str) -> str:
    # Status polls and large-response downloads are read; the rest invoke. An exec poll has no HEAD:
    # its answer wraps the result's body, which a look without taking it does not read.
    if "/exec/status/" in path:
        return "GET"
    if "/status/" in path or "/large-responses/" in path:
        return "GET,HEAD"
    return "GET" if path.startswith("/v1/models") or path.startswith("/v1/health") else "POST"


@final
class Cors:
    """The invocation routes' cross-origin answers; ``gateway`` adds the LLM gateway's paths."""

    def __init__(self, gateway: tuple[str, ...] = ()) -> None:
        self.prefixes = (*PREFIXES, *gateway)

    def applies(self, request: web.Request) -> bool:
        return request.path.startswith(self.prefixes) and not host_routed(request)

    def middleware(self) -> Any:
        """Answers preflights on the invocation routes (added after host routing, so it never sees those)."""

        @web.middleware
        async def preflight(request: web.Request, handler: Handler) -> web.StreamResponse:
            if request.method != "OPTIONS" or not self.applies(request):
                return await handler(request)
            headers = {"Allow": _allowed_methods(request.path), "Access-Control-Max-Age": MAX_AGE}
            asked = request.headers
            if "Access-Control-Request-Method" in asked:
                headers["Access-Control-Allow-Methods"] = asked["Access-Control-Request-Method"]
            if "Access-Control-Request-Headers" in asked:
                headers["Access-Control-Allow-Headers"] = asked["Access-Control-Request-Headers"]
            return web.Response(status=200, headers=headers)  # the hook adds the origin

        return preflight

    def on_response(self, request: web.Request, response: web.StreamResponse) -> None:
        """CORS headers on an invocation route's answer; its ids readable by the page."""
        headers = response.headers
        wanted = [name for name in EXPOSED if name in headers]  # every invocation's answer: kept cheap
        if wanted:
            exposed = headers.get("Access-Control-Expose-Headers", "").strip()
            if exposed:
                have = {part.strip().lower() for part in exposed.split(",")}
                wanted = [exposed, *(name for name in wanted if name not in have)]
            headers["Access-Control-Expose-Headers"] = ", ".join(wanted)
        if not self.applies(request):
            return
        origin = request.headers.get("Origin")
        if origin is not None:
            headers["Access-Control-Allow-Origin"] = origin
            headers["Access-Control-Allow-Credentials"] = "true"
        headers.add("Vary", VARY)
