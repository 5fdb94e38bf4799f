"""The web console: one page the control plane serves at ``/console``, working through the public API.

The page, its script and its style sheet ship in this package (no build step, nothing fetched from
elsewhere). Everything it shows comes from the API with the signed-in credential, so it sees what
that credential may see. The responses forbid framing and any script or style from elsewhere.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from importlib import resources

from aiohttp import web

#: What the console serves: the page, and its files by name.
ROUTES = (("GET", "/console"), ("GET", "/console/"), ("GET", "/console/{name}"))
FILES = {
    "index.html": "text/html",
    "console.js": "text/javascript",
    "console.css": "text/css",
}
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    # Small files: always fresh after an upgrade.
    "Cache-Control": "no-cache",
}


def _file(name: str) -> bytes:
    return (resources.files(__package__) / "static" / name).read_bytes()


async def serve(request: web.Request) -> web.Response:
    """The page (``/console``), or one of its files; anything else is a 404."""
    name = request.match_info.get("name") or "index.html"
    kind = FILES.get(name)
    if kind is None:
        raise web.HTTPNotFound(text=f"the console has no file {name!r}")
    return web.Response(body=_file(name), content_type=kind, charset="utf-8", headers=SECURITY_HEADERS)


def routes() -> list[tuple[str, str, Callable[[web.Request], Awaitable[web.StreamResponse]]]]:
    return [(method, path, serve) for method, path in ROUTES]
