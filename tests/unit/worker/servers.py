"""A real aiohttp server on 127.0.0.1 for the worker's client tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiohttp import web

from nvcf_mono.ports import spare_port


@asynccontextmanager
async def aiohttp_server(routes: web.RouteTableDef) -> AsyncIterator[int]:
    """Serves ``routes`` for the block; yields the port."""
    app = web.Application()
    app.add_routes(routes)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = spare_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield port
    finally:
        await runner.cleanup()
