"""What the caller of an invocation gets back: NVCF's headers, problem answers, and the function's
response, streamed through as it arrives or collected whole, and kept for an idempotent request's retries.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import final

import anyio
from aiohttp import web
from multidict import CIMultiDict

from nvcf_mono.bus.errors import BusError
from nvcf_mono.contracts.buckets import StoredResult
from nvcf_mono.contracts.frames import Frame, header_value
from nvcf_mono.contracts.problems import PROBLEM_CONTENT_TYPE, problem_body
from nvcf_mono.http.problem import ProblemError
from nvcf_mono.planes.invocation.responses import Pending
from nvcf_mono.planes.invocation.results import ResultStore

REQID = "NVCF-REQID"
STATUS = "NVCF-STATUS"
PERCENT = "NVCF-PERCENT-COMPLETE"
POLL = "NVCF-POLL-SECONDS"
WAIT_REASON = "NVCF-WAIT-REASON"
QUEUE_POSITION = "NVCF-QUEUE-POSITION"
#: Never forwarded to the function (hop-by-hop, or the caller's credential).
DROPPED = frozenset(
    h.lower()
    for h in (
        "Authorization", "Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
        "Proxy-Authorization", "TE", "Trailer", "Transfer-Encoding", "Upgrade", "Host", "Content-Length",
        "NVCF-POLL-SECONDS",
    )
)  # fmt: skip
#: Content codings the HTTP server decodes as it reads a request body (aiohttp's): the body that
#: goes on is decoded, so such a ``Content-Encoding`` must not go with it. Any other coding is left
#: to the function, with its body as it came.
DECODED_CODINGS = frozenset({"gzip", "deflate", "br", "zstd"})


def forwarded_headers(headers: Mapping[str, str]) -> list[tuple[str, str]]:
    """The caller's headers the function gets (every value of a repeated one)."""
    coding = headers.get("Content-Encoding", "")
    decoded = coding.isascii() and coding.lower() in DECODED_CODINGS
    items = headers.items()
    return [(k, v) for k, v in items if k.lower() not in DROPPED and not (decoded and k.lower() == "content-encoding")]


#: Response headers the node sets itself.
OWN_RESPONSE = frozenset(
    {"content-length", "transfer-encoding", "connection", "keep-alive", "nvcf-reqid", "nvcf-status"}
)
#: Largest response collected whole instead of streamed (exec's JSON wrapper).
BUFFER_LIMIT = 32 * 1024 * 1024
#: Largest response of an idempotent request kept for its retries.
KEEP_LIMIT = 8 * 1024 * 1024
#: Queued response frames are joined into one write up to this size.
COALESCE = 256 * 1024


def wants_stream(headers: Mapping[str, str]) -> bool:
    """The client accepts exactly ``text/event-stream`` (a longer default wait; no transforms)."""
    return headers.get("Accept", "").strip() == "text/event-stream"


def nvcf_status(status: int) -> str:
    """``in-progress`` (202), ``fulfilled`` (other 2xx/3xx), ``errored``."""
    if status == 202:
        return "in-progress"
    return "fulfilled" if 200 <= status < 400 else "errored"


def problem(status: int, detail: str, request_id: str, *, instance: str | None = None) -> web.Response:
    """A problem+json answer carrying the request id."""
    return web.Response(
        status=status,
        body=json.dumps(problem_body(status, detail, instance=instance)).encode(),
        content_type=PROBLEM_CONTENT_TYPE,
        headers={REQID: request_id, STATUS: nvcf_status(status)},
    )


def unknown_request(request_id: str) -> str:
    return f"request '{request_id}' not found (unknown, or its result was already fetched)"


_TOO_LARGE_TO_KEEP = (
    f"the response was delivered to the first caller; at over {KEEP_LIMIT} bytes it was too large to keep for retries"
)


class ResponseBroken(Exception):
    """The response cannot be completed; the connection is reset rather than a body truncated."""


@final
class ReplyWriter:
    """Writes a function's response to its caller, and keeps it for retries when asked."""

    def __init__(self, *, results: ResultStore, frame_timeout: float, log: logging.Logger) -> None:
        self.results = results
        #: How long a response may go silent between two of its frames.
        self._frame_timeout = frame_timeout
        self.log = log

    async def stream(
        self,
        request: web.Request,
        pending: Pending,
        first: Frame,
        *,
        extra: Mapping[str, str],
        buffered: bool = False,
        keep: bool = False,
        tap: Callable[[bytes], None] | None = None,
    ) -> web.StreamResponse:
        status = first.status or 200
        headers = _passed_on(first.headers)
        headers[REQID] = first.request_id
        headers[STATUS] = nvcf_status(status)
        headers.update(extra)
        if first.last and first.problem is None:
            if keep:
                await self.keep(first, first.body)
            if tap is not None:
                tap(first.body)
            return web.Response(status=status, headers=headers, body=first.body)
        if buffered:
            return await self._collect(request, pending, first, status, headers, keep=keep)
        response = web.StreamResponse(status=status, headers=headers)
        length = header_value(first.headers, "content-length")
        if length is not None and length.isdigit():
            response.content_length = int(length)
        await response.prepare(request)
        kept: list[bytes] | None = [] if keep else None
        kept_size = 0
        try:
            async for chunk, last in self._chunks(pending, first):
                if last:
                    await response.write_eof(chunk)  # the last piece and the body's end in one write
                else:
                    await response.write(chunk)
                if tap is not None:
                    tap(chunk)
                if kept is not None:
                    kept_size += len(chunk)
                    kept.append(chunk)
                    if kept_size > KEEP_LIMIT:
                        kept = None
                        await self.keep_problem(first.request_id, 409, _TOO_LARGE_TO_KEEP)
        except ResponseBroken as err:
            self.log.warning("aborting the response to %s: %s", first.request_id, err)
            if keep:
                await self.keep_problem(first.request_id, 502, str(err))
            transport = request.transport
            if transport is not None:
                transport.abort()  # a reset, never a silently truncated body
            return response
        await response.write_eof()
        if kept is not None:
            await self.keep(first, b"".join(kept))
        return response

    async def _chunks(self, pending: Pending, first: Frame) -> AsyncIterator[tuple[bytes, bool]]:
        """The body pieces of a response, each with whether it is the last; ResponseBroken on a gap, a
        problem, a short body or silence.

        Frames already waiting are joined into one piece (up to ``COALESCE``): a stream of small
        events arriving faster than the client is written to costs one write per batch, not per event.
        Nothing waits for more: a piece goes out as soon as nothing else is queued.
        """
        written = 0
        frame = first
        expected = first.seq
        batch: list[bytes] = []
        batched = 0
        while True:
            # A problem ends the response whatever its number: the node's own word (seq 0) that the
            # instance failed mid-response is the reason to log and keep, not a gap in the frames.
            if frame.problem is not None:
                raise ResponseBroken(f"the response broke off: {frame.problem.detail}")
            if frame.seq != expected or frame.attempt != first.attempt:
                raise ResponseBroken(f"frame {frame.seq} (attempt {frame.attempt}) where {expected} was due")
            if frame.body:
                written += len(frame.body)
                batch.append(frame.body)
                batched += len(frame.body)
            if frame.end:
                if frame.total_length is not None and frame.total_length != written:
                    raise ResponseBroken(f"{written} bytes arrived of {frame.total_length}")
                if batch:
                    yield _joined(batch), True
                return
            expected += 1
            if batch and (not pending.queued or batched >= COALESCE):
                yield _joined(batch), False
                batch, batched = [], 0
            try:
                frame = await pending.next(timeout=self._frame_timeout)
            except TimeoutError:
                raise ResponseBroken("the response stopped arriving") from None

    async def _collect(
        self,
        request: web.Request,
        pending: Pending,
        first: Frame,
        status: int,
        headers: CIMultiDict[str],
        *,
        keep: bool,
    ) -> web.Response:
        """The whole response in memory (bounded), for callers that rewrap it."""
        parts: list[bytes] = []
        size = 0
        try:
            async for chunk, _ in self._chunks(pending, first):
                size += len(chunk)
                if size > BUFFER_LIMIT:
                    if keep:
                        await self.keep_problem(first.request_id, 409, _TOO_LARGE_TO_KEEP)
                    return problem(
                        500,
                        f"the function's response exceeds {BUFFER_LIMIT} bytes, too large to wrap; use pexec",
                        first.request_id,
                        instance=request.path,
                    )
                parts.append(chunk)
        except ResponseBroken as err:
            self.log.warning("the response to %s broke off: %s", first.request_id, err)
            if keep:
                await self.keep_problem(first.request_id, 502, str(err))
            return problem(502, str(err), first.request_id, instance=request.path)
        body = b"".join(parts)
        if keep:
            await self.keep(first, body)
        return web.Response(status=status, headers=headers, body=body)

    async def keep(self, first: Frame, body: bytes) -> None:
        """Store an idempotent request's response for its retries (a failure only costs the retries)."""
        if len(body) > KEEP_LIMIT:
            await self.keep_problem(first.request_id, 409, _TOO_LARGE_TO_KEEP)
            return
        with anyio.move_on_after(10, shield=True):
            try:
                await self.results.store(first.request_id, first.status or 200, first.headers, body)
            except BusError as err:
                self.log.warning("could not keep the response of %s for retries: %s", first.request_id, err)

    async def keep_problem(self, request_id: str, status: int, detail: str) -> None:
        with anyio.move_on_after(10, shield=True):
            try:
                await self.results.store_problem(request_id, status, detail)
            except BusError as err:
                self.log.warning("could not keep the outcome of %s for retries: %s", request_id, err)

    async def render_result(
        self,
        request: web.Request,
        result: StoredResult,
        body: bytes | AsyncIterator[bytes],
        *,
        buffered: bool = False,
    ) -> web.StreamResponse:
        """A stored result as the response: headers and status as kept, the body inline or streamed."""
        headers = _result_headers(result)
        if not isinstance(body, bytes) and buffered:
            if result.body_size > BUFFER_LIMIT:
                raise ProblemError(
                    500, f"the result ({result.body_size} bytes) is too large to wrap; poll it through pexec"
                )
            body = b"".join([chunk async for chunk in body])
        if isinstance(body, bytes):
            return web.Response(status=result.status, headers=headers, body=body)
        response = web.StreamResponse(status=result.status, headers=headers)
        response.content_length = result.body_size
        await response.prepare(request)
        async for chunk in body:
            await response.write(chunk)
        await response.write_eof()
        return response


def head_of(result: StoredResult) -> web.StreamResponse:
    """What :meth:`ReplyWriter.render_result` would answer, without its body (a HEAD)."""
    headers = _result_headers(result)
    headers["Content-Length"] = str(result.body_size)
    return web.Response(status=result.status, headers=headers)


def _result_headers(result: StoredResult) -> CIMultiDict[str]:
    headers = _passed_on(result.headers)
    headers[REQID] = result.request_id
    headers[STATUS] = nvcf_status(result.status)
    if result.percent is not None:
        headers[PERCENT] = str(result.percent)
    return headers


def _passed_on(given: Iterable[tuple[str, str]]) -> CIMultiDict[str]:
    """The function's response headers the caller gets (those the node sets itself left out)."""
    headers: CIMultiDict[str] = CIMultiDict()
    for key, value in given:  # add() one by one: a third of the cost of building it from a generator
        if key.lower() not in OWN_RESPONSE:
            headers.add(key, value)
    return headers


def _joined(pieces: list[bytes]) -> bytes:
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)
