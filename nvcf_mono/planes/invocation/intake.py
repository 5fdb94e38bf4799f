"""How every entry point (HTTP pexec and exec, the gRPC proxy) makes the request it publishes.

A body in hand travels inline when small and is stored as the request's body object otherwise;
the request carries the caller's account (NVCF's ncaId, which differs from the owner's for a shared
function), the reply subject of this node, and the deadline past which nobody waits for it.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterable, Mapping

import attrs
from aiohttp import web

from nvcf_mono.auth.principal import Principal
from nvcf_mono.contracts.frames import Request
from nvcf_mono.http.problem import ProblemError
from nvcf_mono.models.function import FunctionVersion
from nvcf_mono.planes.invocation.answers import POLL
from nvcf_mono.planes.invocation.config import InvocationConfig
from nvcf_mono.planes.invocation.dispatch import Dispatcher
from nvcf_mono.planes.invocation.held_input import Hold


@attrs.frozen
class Body:
    """A request body: inline bytes, or the name of the object that holds it."""

    inline: bytes
    object_name: str | None
    size: int


async def stage(dispatcher: Dispatcher, inline_limit: int, request_id: str, body: bytes) -> Body:
    """A body already read: inline when it fits, else stored as the request's body object."""
    if len(body) <= inline_limit:
        return Body(body, None, len(body))

    async def once() -> AsyncIterator[bytes]:
        yield body

    name, size = await dispatcher.put_body(request_id, once())
    return Body(b"", name, size)


def new_request(
    principal: Principal,
    fv: FunctionVersion,
    *,
    request_id: str,
    reply: str,
    method: str,
    path: str,
    headers: Iterable[tuple[str, str]],
    body: Body,
    window: float,
    poll_seconds: int,
    region: str,
    streaming: bool = False,
    grpc: bool = False,
    live_input: bool = False,
    asset_ids: tuple[str, ...] = (),
) -> Request:
    """The request to publish; nobody waits for it past ``window`` seconds from now. ``region``: this
    node's (the function's ``NVCF-INVOCATION-REGION``).
    """
    now_ms = int(time.time() * 1000)
    return Request(
        request_id=request_id,
        nca_id=principal.account,
        function_id=fv.id,
        function_version_id=fv.version_id,
        function_name=fv.name,
        method=method,
        path=path,
        headers=tuple(headers),
        reply=reply,
        time_ms=now_ms,
        deadline_ms=now_ms + int(window * 1000),
        poll_seconds=poll_seconds,
        body=body.inline,
        body_object=body.object_name,
        body_size=body.size,
        client_subject=principal.subject,
        streaming=streaming,
        grpc=grpc,
        live_input=live_input,
        asset_ids=asset_ids,
        invocation_region=region,
    )


def poll_seconds(config: InvocationConfig, headers: Mapping[str, str], *, streaming: bool) -> int:
    """Seconds the caller waits for the response head before a 202 (``NVCF-POLL-SECONDS``)."""
    raw = headers.get(POLL)
    if raw is None or raw.strip() == "":
        return config.streaming_poll_seconds if streaming else config.default_poll_seconds
    try:
        value = int(raw.strip())
    except ValueError:
        raise ProblemError(400, f"{POLL} must be a whole number of seconds, got {raw[:64]!r}") from None
    # NVCF reads the header as an unsigned number: a negative one is not a number of seconds.
    if not 0 <= value <= config.max_poll_seconds:
        raise ProblemError(400, f"{POLL} must be from 0 to {config.max_poll_seconds} seconds, got {value}")
    return max(value, 1)  # 0 waits the least there is, as NVCF clamps it


def _declared_within(request: web.Request, maximum: int) -> None:
    """413 for a declared length past the limit: refused before a byte is read or stored."""
    if request.content_length is not None and request.content_length > maximum:
        raise ProblemError(413, _too_large(maximum))


async def read_prefix(config: InvocationConfig, request: web.Request, size: int, *, hold: Hold) -> bytes:
    """Up to ``size`` bytes of the body, the rest left to :func:`read_body` (413 past the limit); ``hold``
    counts them.
    """
    maximum = config.max_request_body
    _declared_within(request, maximum)
    prefix = bytearray()
    while len(prefix) < size and (chunk := await request.content.read(size - len(prefix))):
        hold.take(len(chunk))
        prefix.extend(chunk)
    if len(prefix) > maximum:
        raise ProblemError(413, _too_large(maximum))
    return bytes(prefix)


async def read_body(
    config: InvocationConfig,
    dispatcher: Dispatcher,
    request: web.Request,
    request_id: str,
    *,
    prefix: bytes = b"",
    hold: Hold,
) -> Body:
    """Small bodies inline; the rest streamed into the object store. ``prefix``: what was read of it already.

    ``hold`` counts what is kept in memory: an inline body; of a stored one, what was read before it was
    known to be too large to inline, until it is stored (what streams on is let go piece by piece).
    """
    maximum = config.max_request_body
    _declared_within(request, maximum)
    limit = min(dispatcher.inline_limit, maximum)
    head = bytearray(prefix)
    content = request.content
    while len(head) <= limit:
        chunk = await content.read(limit + 1 - len(head))
        if not chunk:
            return Body(bytes(head), None, len(head))
        hold.take(len(chunk))
        head.extend(chunk)
    if len(head) > maximum:  # a body without Content-Length past the limit: refused before anything is stored
        raise ProblemError(413, _too_large(maximum))

    async def rest() -> AsyncIterator[bytes]:
        size = len(head)
        yield bytes(head)
        async for chunk in content.iter_chunked(1024 * 1024):
            size += len(chunk)
            if size > maximum:  # a body without Content-Length: what was stored of it is removed
                raise ProblemError(413, _too_large(maximum))
            yield chunk

    name, size = await dispatcher.put_body(request_id, rest())
    hold.give(len(head) - len(prefix))  # stored: only the prefix (the request's fingerprint) is still held
    return Body(b"", name, size)


def _too_large(maximum: int) -> str:
    return (
        f"the request body exceeds the invocation limit of {maximum} bytes (plugins.invocation.max_request_body); "
        "hand larger inputs to the function as assets (NVCF-INPUT-ASSET-REFERENCES)"
    )
