"""What the HTTP examples share: serving an aiohttp application, and a health route.

Kept apart from the package's ``__init__`` so the gRPC echo and the task example start without aiohttp.
"""

from __future__ import annotations

import argparse

from aiohttp import web


def serve_http(application: web.Application, args: argparse.Namespace) -> None:
    """Serve an HTTP example on ``args.host:args.port`` until interrupted, without an access log."""
    web.run_app(application, host=args.host, port=args.port, access_log=None, print=None)


async def health(request: web.Request) -> web.Response:
    """Ready as soon as the server listens."""
    return web.json_response({"status": "OK"})
