"""How every entry point (HTTP pexec and exec, the gRPC proxy) makes the request it publishes.

A body in hand travels inline when small and is stored as the request's body object otherwise;
the request carries the caller's account (NVCF's ncaId, which differs from the owner's for a shared
function), the reply subject of this node, and the deadline past which nobody waits for it.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterable

import attrs

from nvcf_mono.auth.principal import Principal
from nvcf_mono.contracts.frames import Request
from nvcf_mono.models.function import FunctionVersion
from nvcf_mono.planes.invocation.dispatch import Dispatcher


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
    streaming: bool = False,
    grpc: bool = False,
    asset_ids: tuple[str, ...] = (),
) -> Request:
    """The request to publish; nobody waits for it past ``window`` seconds from now."""
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
        asset_ids=asset_ids,
    )
