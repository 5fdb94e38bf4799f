"""A lean HTTP/1.1 client for the worker's hot call: each request, sent to the inference server beside it.

aiohttp's client spends about 100 µs of CPU on a small call on the reference machine (request and
response objects, its connector's bookkeeping, timers, trace hooks); this client about 25 µs. It
keeps connections to that one server alive, writes a request in one piece, parses responses with
httptools (llhttp, the parser under uvicorn) and hands the body out as it arrives, with backpressure
on large bodies. The health checks of the inference server use it too.

What it does not do (the inference server is a local process, not the web): redirects, cookies,
proxies, TLS, decompression, upgrades. A response to ``HEAD``, an upgrade, an error or an unread
body ends its connection; a complete response that allows keep-alive gives it back to the pool.
"""

from __future__ import annotations

import asyncio
import re
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator, Mapping
from contextlib import asynccontextmanager
from types import TracebackType
from typing import final

import anyio
import httptools
from yarl import URL

#: Body bytes buffered before the connection stops reading until they are taken.
HIGH_WATER = 1 << 20
#: Idle connections kept for the next calls.
MAX_IDLE = 256
#: Longest response head (status line and headers) accepted.
MAX_HEAD = 64 * 1024
#: A request target written as it is (anything else is normalised as aiohttp would, with yarl).
_PLAIN_TARGET = re.compile(r"/[A-Za-z0-9\-._~!$&'()*+,;=:@/?%]*")


def _unsafe(text: str) -> bool:
    """A line break or NUL: what would let a header value write another header or end the head.

    Three substring scans (memchr) for the whole head cost a twentieth of a regular expression's.
    """
    return "\r" in text or "\n" in text or "\x00" in text


class Unreachable(Exception):
    """The server did not accept a connection: nothing was sent."""


class Broken(Exception):
    """The connection failed or ended before the response was complete."""


class BadResponse(Exception):
    """The server's answer is not HTTP/1.x that this client reads."""


@final
class Response:
    """One response: status and headers once the head has arrived, then the body as it comes."""

    def __init__(self, connection: _Connection, method: str) -> None:
        self._connection = connection
        self._head_only = method == "HEAD"
        self.status = 0
        #: As the server wrote them (names' case kept; repeated names repeated).
        self.headers: list[tuple[str, str]] = []
        #: The Content-Length the server announced, if any.
        self.content_length: int | None = None
        self._chunked = False
        self._interim = False
        self._head_size = 0
        self._head_ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._buffer: deque[bytes] = deque()
        self._buffered = 0
        self._waiter: asyncio.Future[None] | None = None
        self._done = False
        self._keep_alive = False
        self._error: Exception | None = None

    # ---- the caller's side -----------------------------------------------------------------------

    async def read(self, n: int) -> bytes:
        """Up to ``n`` bytes of the body, waiting for some; ``b""`` at its end. Raises :class:`Broken`."""
        while not self._buffer and not self._done:
            if self._error is not None:
                raise self._error
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self.read_nowait(n)

    def read_nowait(self, n: int) -> bytes:
        """Up to ``n`` bytes of what has arrived (``b""`` if nothing has)."""
        taken: list[bytes] = []
        size = 0
        while self._buffer and size < n:
            piece = self._buffer.popleft()
            if size + len(piece) > n:
                self._buffer.appendleft(piece[n - size :])
                piece = piece[: n - size]
            taken.append(piece)
            size += len(piece)
        self._buffered -= size
        if self._buffered <= HIGH_WATER // 2:
            self._connection.resume_reading()
        return taken[0] if len(taken) == 1 else b"".join(taken)

    def at_eof(self) -> bool:
        """The whole body has arrived and been read."""
        return self._done and not self._buffer

    @property
    def reusable(self) -> bool:
        """Complete, read, and the server keeps the connection open."""
        return self._done and not self._buffer and self._keep_alive and self._error is None

    async def _wait_head(self) -> None:
        await self._head_ready

    # ---- the connection's side -------------------------------------------------------------------

    def _header(self, name: bytes, value: bytes) -> None:
        if self._done:
            raise BadResponse("the inference server sent more after its response")
        self._head_size += len(name) + len(value) + 4
        if self._head_size > MAX_HEAD:
            raise BadResponse(f"the response head is larger than {MAX_HEAD} bytes")
        if self._interim:
            return
        # As aiohttp reads them: UTF-8, bytes that are not kept as surrogates (they go out as they came).
        key = name.decode("utf-8", "surrogateescape")
        text = value.decode("utf-8", "surrogateescape")
        self.headers.append((key, text))
        lower = key.lower()
        if lower == "content-length":
            try:
                self.content_length = int(text)
            except ValueError as err:
                raise BadResponse(f"Content-Length {text!r}") from err
        elif lower == "transfer-encoding" and "chunked" in text.lower():
            self._chunked = True

    def _head(self, status: int) -> None:
        if self._done:
            raise BadResponse("the inference server sent more after its response")
        if 100 <= status < 200 and status != 101:
            self._interim = True  # 100 Continue and the like: the real response follows
            return
        self.status = status
        if not self._head_ready.done():
            self._head_ready.set_result(None)
        if self._head_only or status == 101:
            self._finish(keep_alive=False)  # no body follows, whatever the headers say

    def _body(self, data: bytes) -> None:
        if self._done:
            return
        self._buffer.append(data)
        self._buffered += len(data)
        if self._buffered > HIGH_WATER:
            self._connection.pause_reading()
        self._wake()

    def _complete(self, keep_alive: bool) -> None:
        if self._interim:  # what the interim response said is not the real response's
            self._interim = False
            self.headers.clear()
            self._head_size = 0
            self.content_length = None
            self._chunked = False
            return
        self._finish(keep_alive=keep_alive)

    def _finish(self, *, keep_alive: bool) -> None:
        if not self._done:
            self._done = True
            self._keep_alive = keep_alive
            self._wake()

    def _fail(self, error: Exception) -> None:
        if self._done:
            return
        self._error = error
        if not self._head_ready.done():
            self._head_ready.set_exception(error)
            self._head_ready.exception()  # retrieved: nobody may be waiting any more
        self._wake()

    def _lost(self, exc: BaseException | None) -> None:
        """The connection is gone: the end of a body that runs until close, else a broken response."""
        if self._done or self._error is not None:
            return
        if self.status and not self._interim and self.content_length is None and not self._chunked:
            self._finish(keep_alive=False)
        else:
            why = f": {exc}" if exc else ""
            self._fail(Broken(f"the inference server closed the connection before the response was complete{why}"))

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


@final
class _Connection(asyncio.Protocol):
    """One kept-alive connection; serves one response at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.lost = False
        self._parser = httptools.HttpResponseParser(self)
        # As lenient as aiohttp's client was: real servers write bare LFs (busybox httpd's CGI headers)
        # and other small liberties.
        self._parser.set_dangerous_leniencies(
            lenient_headers=True, lenient_optional_cr_before_lf=True, lenient_spaces_after_chunk_size=True
        )
        self._response: Response | None = None
        self._reading_paused = False
        self._write_paused = False
        self._drained: asyncio.Future[None] | None = None

    @property
    def open(self) -> bool:
        return not self.lost and self.transport is not None and not self.transport.is_closing()

    def begin(self, response: Response) -> None:
        self._response = response

    def end(self) -> None:
        self._response = None

    def close(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    # ---- writing -----------------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        if not self.open:
            raise Broken("the connection to the inference server is closed")
        assert self.transport is not None
        self.transport.write(data)

    async def drain(self) -> None:
        if self.lost:
            raise Broken("the connection to the inference server is closed")
        if self._write_paused:
            self._drained = asyncio.get_running_loop().create_future()
            try:
                await self._drained
            finally:
                self._drained = None

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    # ---- reading -----------------------------------------------------------------------------------

    def pause_reading(self) -> None:
        if not self._reading_paused and self.transport is not None:
            self._reading_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self._reading_paused and self.transport is not None and not self.lost:
            self._reading_paused = False
            self.transport.resume_reading()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        response = self._response
        if response is None:
            self.close()  # the server spoke out of turn (an idle connection): not reusable
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            pass  # an upgrade ended the response (Response._head); the connection is not reused
        except httptools.HttpParserError as err:
            cause = err.__context__ if isinstance(err.__context__, BadResponse) else None
            response._fail(cause or BadResponse(f"the inference server's response is not HTTP/1.1: {err}"))
            self.close()

    def eof_received(self) -> bool | None:
        return None  # close the transport: a half-closed connection is done

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self._response is not None:
            self._response._lost(exc)
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)  # drain() sees `lost` and raises

    # ---- httptools' callbacks ------------------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._response is not None:
            self._response._header(name, value)

    def on_headers_complete(self) -> None:
        if self._response is not None:
            self._response._head(self._parser.get_status_code())

    def on_body(self, body: bytes) -> None:
        if self._response is not None:
            self._response._body(body)

    def on_message_complete(self) -> None:
        if self._response is not None:
            self._response._complete(self._parser.should_keep_alive())


@final
class Http1Client:
    """Kept-alive HTTP/1.1 connections to one server (``host``:``port``)."""

    def __init__(self, host: str, port: int, *, connect_timeout: float) -> None:
        self._host = host
        self._port = port
        self._base = f"http://{host}:{port}"
        self._host_header = f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"
        self._connect_timeout = connect_timeout
        self._idle: list[_Connection] = []
        self._closed = False

    async def __aenter__(self) -> Http1Client:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self._closed = True
        for connection in self._idle:
            connection.close()
        self._idle.clear()

    @asynccontextmanager
    async def request(
        self, method: str, target: str, headers: Mapping[str, str], body: bytes | AsyncIterable[bytes]
    ) -> AsyncIterator[Response]:
        """Send a request and yield its response once its head has arrived.

        Raises :class:`Unreachable` when no connection could be made, :class:`Broken` when the
        connection fails before the head, :class:`BadResponse` for an answer that is not HTTP.
        """
        head, chunked = self._head(method, target, headers, body)
        connection = await self._connection()
        response = Response(connection, method)
        connection.begin(response)
        reuse = False
        try:
            if isinstance(body, bytes):
                connection.write(head + body)
            else:
                await self._stream(connection, head, body, chunked=chunked)
            await response._wait_head()
            yield response
            reuse = response.reusable
        finally:
            connection.end()
            if reuse and not self._closed and len(self._idle) < MAX_IDLE and connection.open:
                self._idle.append(connection)
            else:
                connection.close()

    def _head(
        self, method: str, target: str, headers: Mapping[str, str], body: bytes | AsyncIterable[bytes]
    ) -> tuple[bytes, bool]:
        """The request's head, and whether its body goes chunked (a stream of unknown length)."""
        if not _PLAIN_TARGET.fullmatch(target):
            target = URL(self._base + target).raw_path_qs  # quoted as aiohttp would
        if _unsafe("".join(headers)) or _unsafe("".join(headers.values())):
            name = next(n for n, v in headers.items() if _unsafe(n) or _unsafe(v))
            raise ValueError(f"header {name!r} holds a line break or NUL: refusing to send it")
        lines = [f"{method} {target} HTTP/1.1"]
        named = set()
        for name, value in headers.items():
            named.add(name.lower())
            lines.append(f"{name}: {value}")
        if "host" not in named:
            lines.append(f"Host: {self._host_header}")
        chunked = False
        if "content-length" not in named:
            if isinstance(body, bytes):
                lines.append(f"Content-Length: {len(body)}")
            elif "transfer-encoding" not in named:
                lines.append("Transfer-Encoding: chunked")
                chunked = True
        lines.append("\r\n")
        # Header values may carry bytes that were not UTF-8 (kept as surrogates): they go out as they came.
        return "\r\n".join(lines).encode("utf-8", "surrogateescape"), chunked

    @staticmethod
    async def _stream(connection: _Connection, head: bytes, body: AsyncIterable[bytes], *, chunked: bool) -> None:
        connection.write(head)
        async for chunk in body:
            if chunk:
                connection.write(b"%x\r\n%b\r\n" % (len(chunk), chunk) if chunked else chunk)
                await connection.drain()
        if chunked:
            connection.write(b"0\r\n\r\n")

    async def _connection(self) -> _Connection:
        while self._idle:
            connection = self._idle.pop()
            if connection.open:
                return connection
        loop = asyncio.get_running_loop()
        try:
            with anyio.fail_after(self._connect_timeout):
                _, connection = await loop.create_connection(_Connection, self._host, self._port)
        except (OSError, TimeoutError) as err:
            raise Unreachable(f"cannot connect to the inference server at {self._base}: {err}") from err
        return connection
