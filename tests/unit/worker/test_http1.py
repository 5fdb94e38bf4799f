"""The worker's HTTP/1.1 client against real servers on 127.0.0.1: aiohttp's, and raw ones that answer
in the ways a real inference server may (interim responses, bodies that end with the connection,
connections closed between calls, malformed answers).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio
import pytest
from aiohttp import web

from nvcf_mono.ports import free_port
from nvcf_mono.worker.http1 import BadResponse, Broken, Http1Client, Unreachable
from tests.unit.worker.servers import aiohttp_server


@asynccontextmanager
async def raw_server(answer: Callable[[bytes], bytes | None], *, close_after: bool = False) -> AsyncIterator[list[int]]:
    """A server that reads one request head at a time and writes ``answer(head)`` (None: close at once);
    yields the list of client ports it saw connect (one per connection).
    """
    peers: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peers.append(writer.get_extra_info("peername")[1])
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                await reader.readexactly(length)
                reply = answer(head)
                if reply is None:
                    break
                writer.write(reply)
                await writer.drain()
                if close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    peers.insert(0, port)
    try:
        yield peers
    finally:
        server.close()


async def call(
    client: Http1Client, method: str = "POST", target: str = "/x", body: bytes = b""
) -> tuple[int, dict[str, str], bytes]:
    with anyio.fail_after(10):
        async with client.request(method, target, {"Content-Type": "text/plain"}, body) as response:
            parts = []
            while chunk := await response.read(65536):
                parts.append(chunk)
            assert response.at_eof()
            return response.status, dict(response.headers), b"".join(parts)


def client_of(seen: list[int]) -> Http1Client:
    return Http1Client("127.0.0.1", seen[0], connect_timeout=2)


async def test_calls_reuse_one_kept_alive_connection() -> None:
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi"
    async with raw_server(lambda head: ok) as seen:
        client = client_of(seen)
        for _ in range(5):
            assert await call(client) == (200, {"Content-Length": "2"}, b"hi")
        client.close()
        assert len(seen) - 1 == 1  # one connection for all five


async def test_a_connection_the_server_closes_is_not_used_again() -> None:
    closing = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi"
    async with raw_server(lambda head: closing, close_after=True) as seen:
        client = client_of(seen)
        for _ in range(3):
            assert (await call(client))[2] == b"hi"
        client.close()
        assert len(seen) - 1 == 3


async def test_a_body_without_a_length_ends_with_the_connection() -> None:
    async with raw_server(lambda head: b"HTTP/1.1 200 OK\r\n\r\nuntil the end", close_after=True) as seen:
        assert await call(client_of(seen)) == (200, {}, b"until the end")


async def test_a_head_with_bare_line_feeds_is_read_as_aiohttp_read_it() -> None:
    # What busybox httpd sends for a CGI script: its status line, then the script's own LF-only headers.
    cgi = b"HTTP/1.0 200 OK\r\nContent-Type: application/json\n\n{}"
    async with raw_server(lambda head: cgi, close_after=True) as seen:
        assert await call(client_of(seen)) == (200, {"Content-Type": "application/json"}, b"{}")


async def test_interim_responses_are_skipped_and_head_has_no_body() -> None:
    def answer(head: bytes) -> bytes:
        if head.startswith(b"HEAD"):
            return b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n"  # the length a GET would have
        interim = b"HTTP/1.1 100 Continue\r\nX-Interim: yes\r\n\r\n"
        interim += b"HTTP/1.1 103 Early Hints\r\nContent-Length: 9\r\n\r\n"  # a length that is not the answer's
        return interim + b"HTTP/1.1 201 Created\r\nContent-Length: 4\r\n\r\ndone"

    async with raw_server(answer) as seen:
        client = client_of(seen)
        assert await call(client) == (201, {"Content-Length": "4"}, b"done")
        assert await call(client, "HEAD") == (200, {"Content-Length": "1000"}, b"")
        assert await call(client) == (201, {"Content-Length": "4"}, b"done")
        client.close()


async def test_a_body_cut_short_is_broken_and_garbage_is_a_bad_response() -> None:
    short = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort"
    async with raw_server(lambda head: short, close_after=True) as seen:
        with pytest.raises(Broken):
            await call(client_of(seen))
    async with raw_server(lambda head: None) as seen:  # closes without a word
        with pytest.raises(Broken):
            await call(client_of(seen))
    async with raw_server(lambda head: b"SMTP ready\r\n\r\n") as seen:
        with pytest.raises(BadResponse):
            await call(client_of(seen))
    with pytest.raises(Unreachable):
        await call(Http1Client("127.0.0.1", free_port("127.0.0.1"), connect_timeout=2))


async def test_what_is_sent_arrives_as_meant() -> None:
    routes = web.RouteTableDef()

    @routes.route("*", "/{tail:.*}")
    async def mirror(request: web.Request) -> web.Response:
        body = await request.read()
        seen = f"{request.method} {request.raw_path} {request.headers.get('Transfer-Encoding', '-')} {len(body)}"
        return web.Response(body=body, headers={"X-Seen": seen, "X-Name": "Grüße"})

    async def stream() -> AsyncIterator[bytes]:
        for i in range(50):
            yield bytes([i]) * 1000

    async with aiohttp_server(routes) as port, Http1Client("127.0.0.1", port, connect_timeout=2) as client:
        status, headers, body = await call(client, "PUT", "/a b/ü?q=1 2", b"payload")
        assert (status, body) == (200, b"payload")
        assert headers["X-Seen"] == "PUT /a%20b/%C3%BC?q=1+2 - 7"  # quoted as aiohttp's client would
        assert headers["X-Name"] == "Grüße"
        with anyio.fail_after(10):
            async with client.request("POST", "/stream", {}, stream()) as response:  # no length: chunked
                assert response.headers and dict(response.headers)["X-Seen"] == "POST /stream chunked 50000"
                assert len(await response.read(100_000)) + len(await response.read(100_000)) >= 1
        for evil in ({"X-Evil": "a\r\nX-Injected: 1"}, {"X-Ok": "1", "X-Evil\x00": "v", "X-Also": "2"}):
            with pytest.raises(ValueError, match=r"'X-Evil.*' holds a line break or NUL"):
                async with client.request("GET", "/", evil, b""):
                    pass


async def test_a_large_body_is_read_in_full_with_the_connection_paused_meanwhile() -> None:
    blob = bytes(range(256)) * 4096 * 5  # 5 MiB: over the high-water mark
    routes = web.RouteTableDef()

    @routes.post("/large")
    async def large(_: web.Request) -> web.Response:
        return web.Response(body=blob)

    async with aiohttp_server(routes) as port, Http1Client("127.0.0.1", port, connect_timeout=2) as client:
        with anyio.fail_after(20):
            async with client.request("POST", "/large", {}, b"") as response:
                await anyio.sleep(0.3)  # the client reads nothing for a while: the connection stops reading
                parts = []
                while chunk := await response.read(256 * 1024):
                    parts.append(chunk)
        assert b"".join(parts) == blob
        assert (await call(client, "POST", "/large"))[2] == blob  # and the connection is fine for the next


async def test_a_response_left_unread_closes_its_connection() -> None:
    async with raw_server(lambda head: b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n0123456789") as seen:
        client = client_of(seen)
        async with client.request("GET", "/", {}, b"") as response:
            assert response.status == 200  # the caller stops here, the body unread
        assert (await call(client))[2] == b"0123456789"
        client.close()
        assert len(seen) - 1 == 2  # the unread one's connection was not reused
