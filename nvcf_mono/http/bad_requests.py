"""Requests aiohttp cannot parse (too long a line, too many headers, not HTTP) answered in problem+json.

aiohttp answers them itself, before any route or middleware runs: plain text quoting the offending
bytes, and an error-level log line whose traceback quotes them too (an ``Authorization`` header
included). Its connection handler is swapped here for one whose ``handle_error`` renders the problem
like every other error and logs only what kind of input it was, never its bytes.
"""

from __future__ import annotations

from typing import Any, final

from aiohttp import http_exceptions, web

from nvcf_mono.http.problem import problem_response

# (exception class, detail): the first that matches describes the input without quoting it.
_KINDS: tuple[tuple[type[BaseException], str], ...] = (
    (http_exceptions.LineTooLong, "the request line or a header is longer than the server accepts"),
    (http_exceptions.BadHttpMethod, "the request line has no valid HTTP method (is this HTTP?)"),
    (http_exceptions.BadStatusLine, "the request line is malformed"),
    (http_exceptions.InvalidHeader, "a header is malformed"),
    (http_exceptions.InvalidURLError, "the request target is not a valid URL"),
    (http_exceptions.PayloadEncodingError, "the body's framing or encoding is malformed"),
)
_TOO_MANY_HEADERS = "Too many headers received"


def unreadable_body(err: web.RequestPayloadError) -> str:
    """A detail for a body that could not be read to its end, by what was wrong with it."""
    cause = err.__cause__
    if isinstance(cause, http_exceptions.ContentEncodingError):
        return "the request body is not valid data of its Content-Encoding"
    if isinstance(cause, http_exceptions.TransferEncodingError):
        return "the request body's chunked framing is malformed"
    if isinstance(cause, http_exceptions.ContentLengthError):
        return "the request body ended before its Content-Length"
    return "the request body could not be read to its end"


def describe(exc: BaseException | None) -> str:
    """A detail for a request that could not be parsed, naming the kind of fault and none of its bytes."""
    if isinstance(exc, http_exceptions.BadHttpMessage) and exc.message == _TOO_MANY_HEADERS:
        return "the request has more headers than the server accepts"
    for kind, detail in _KINDS:
        if isinstance(exc, kind):
            return detail
    return "the request is not valid HTTP/1.1"


@final
class ProblemRequestHandler(web.RequestHandler):
    """aiohttp's connection handler, with parse errors (and its own 500/504) rendered as problem+json."""

    __slots__ = ()

    def log_exception(self, *args: Any, **kw: Any) -> None:
        # After the answer, aiohttp reads what is left of the body to keep the connection; a body that
        # cannot be read (the fault the answer already named) only closes the connection.
        if isinstance(kw.get("exc_info"), web.RequestPayloadError):
            self.logger.debug("connection closed after an unreadable request body")
            return
        super().log_exception(*args, **kw)

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if request.writer.output_size > 0:
            # Part of a response is out: the connection is beyond repair (aiohttp's own rule).
            raise ConnectionError("the response was already started; the connection is closed instead")
        if status >= 500:
            # The application answered nothing: a fault of the server, worth its traceback (our code's,
            # not the request's bytes).
            self.logger.error("unanswered request (%d): %s", status, type(exc).__name__, exc_info=exc)
            detail = "internal error; the server log has the details" if status == 500 else "the server timed out"
        elif isinstance(exc, http_exceptions.ContentEncodingError):
            # Raised as the body begins: a coding this server has no decoder for (br, zstd).
            status, detail = 415, "the request's Content-Encoding is not supported: send gzip, deflate or no coding"
        else:
            detail = describe(exc)
            self.logger.debug("unparseable request from %s: %s", request.remote, type(exc).__name__)
        response = problem_response(status, detail)
        response.force_close()
        return response


@final
class _Server(web.Server):
    """The low-level server, creating :class:`ProblemRequestHandler` connections."""

    def __call__(self) -> web.RequestHandler:
        return ProblemRequestHandler(self, loop=self._loop, **self._kwargs)


@final
class ProblemAppRunner(web.AppRunner):
    """``web.AppRunner`` whose connections answer unparseable requests in problem+json."""

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        kwargs: dict[str, Any] = dict(server._kwargs)
        return _Server(
            server.request_handler,
            request_factory=server.request_factory,
            handler_cancellation=server.handler_cancellation,
            loop=server._loop,
            **kwargs,
        )
