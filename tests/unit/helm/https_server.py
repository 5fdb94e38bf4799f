"""A local https server with its own CA, to fetch charts from the way a chart repository serves them."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from aiohttp import web

from nvcf_mono.tls import development_certificate


def issue_tls(directory: Path) -> tuple[Path, ssl.SSLContext]:
    """A CA (its certificate file, for the client) and a server context for 127.0.0.1 signed by it:
    the platform's own development certificate (``nvcf_mono.tls``), made under ``directory``.
    """
    files = development_certificate(directory, ["127.0.0.1"])
    assert files.ca is not None
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(files.cert, files.key)
    return files.ca, server


@asynccontextmanager
async def serving(app: web.Application, context: ssl.SSLContext | None) -> AsyncIterator[str]:
    """Serve ``app`` over https on a free port of 127.0.0.1 (plain http without ``context``); yields the base URL."""
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        yield f"{'https' if context is not None else 'http'}://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
