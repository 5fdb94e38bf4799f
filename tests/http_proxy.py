"""A forward HTTP proxy for tests, as an operator's would be: absolute-form requests (``POST http://...``) are
passed on, ``CONNECT host:port`` is tunnelled. It records what it was asked to reach (``seen``), and can
refuse everything (``refuse``) to show a request really went through it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from urllib.parse import urlsplit

import attrs


@attrs.define
class Proxy:
    url: str = ""
    #: (method, host:port) of each request, in order.
    seen: list[tuple[str, str]] = attrs.Factory(list)
    refuse: bool = False


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with suppress(OSError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    with suppress(OSError):
        writer.close()


async def _serve(proxy: Proxy, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
        writer.close()
        return
    request_line, *header_lines = head.decode("latin-1").split("\r\n")
    method, target, version = request_line.split(" ", 2)
    if method == "CONNECT":
        host, _, port = target.rpartition(":")
    else:
        parts = urlsplit(target)
        host, port = parts.hostname or "", str(parts.port or 80)
        target = parts.path + (f"?{parts.query}" if parts.query else "")
    proxy.seen.append((method, f"{host}:{port}"))
    try:
        if proxy.refuse:
            raise OSError("refused by the test proxy")
        up_reader, up_writer = await asyncio.open_connection(host.strip("[]"), int(port))
    except OSError:
        writer.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        await writer.drain()
        writer.close()
        return
    if method == "CONNECT":
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await writer.drain()
    else:
        # One request per connection: the client opens another for its next one.
        kept = [h for h in header_lines if h and not h.lower().startswith(("proxy-", "connection:"))]
        up_writer.write(f"{method} {target} {version}\r\n".encode("latin-1"))
        up_writer.write(("\r\n".join([*kept, "Connection: close"]) + "\r\n\r\n").encode("latin-1"))
    await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))


@asynccontextmanager
async def http_proxy() -> AsyncIterator[Proxy]:
    """The proxy on a free port of 127.0.0.1 (``url`` set)."""
    proxy = Proxy()
    server = await asyncio.start_server(lambda r, w: _serve(proxy, r, w), "127.0.0.1", 0)
    proxy.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        yield proxy
    finally:
        server.close()
        with suppress(Exception):
            await asyncio.wait_for(server.wait_closed(), 2)
