"""Large responses: what a function leaves in ``NVCF-LARGE-OUTPUT-DIR``, zipped with its body, behind a link.

As NVCF's worker does, the worker zips the response body (as ``<requestId>.response``) with the
files the function wrote for the request and the caller gets ``302`` with ``Location``. Here the
worker uploads the zip to its invocation node (``UploadLargeResponse``), which keeps it in the
payload store for the result's lifetime and answers with a signed download link: like an S3
pre-signed URL, the link carries its own authorization (an expiry and an HMAC over the request id
and the expiry, keyed from the platform secret), so any node can serve it and it needs no bearer.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Callable
from contextlib import AbstractAsyncContextManager
from typing import final

from nvcf_mono.bus.api import ObjectReader, ObjectStore
from nvcf_mono.bus.upload_room import UploadRoom, held_to
from nvcf_mono.http import signed_links

#: The download route (``GET``), under the invocation API.
ROUTE = "/v2/nvcf/pexec/large-responses/{requestId}"
#: What a download link's signature covers besides the request id.
PURPOSE = "nvcf-large-response"


class TooLarge(Exception):
    """A large response over the plane's limit."""


def object_name(request_id: str) -> str:
    return f"large/{request_id}"


@final
class LargeResponses:
    """Stores zipped large responses and signs and checks their download links."""

    def __init__(
        self,
        store: ObjectStore,
        *,
        link_key: Callable[[], bytes],
        base_url: Callable[[], str],
        ttl: float,
        limit: int,
        room: UploadRoom,
    ) -> None:
        self._store = store
        self._room = room
        self._link_key = link_key
        self._base_url = base_url
        self._ttl = ttl
        self._limit = limit

    async def store(self, request_id: str, chunks: AsyncIterable[bytes]) -> tuple[str, int]:
        """Keep a request's zip; its download link and size. TooLarge past the limit (nothing is kept).

        The limit is the plane's, or the room uploads have left in the store when that is less: a zip is
        kept like an upload, never in the store's reserve (:mod:`nvcf_mono.bus.upload_room`).
        """
        limit = self._limit
        why = f"the large response exceeds the limit of {limit} bytes (plugins.invocation.max_large_response)"
        no_room = (
            "the platform's message store has no room for this large response (the rest is kept for queued requests)"
        )
        room = await self._room.left()
        if room is not None and room < limit:
            limit, why = room, no_room
        bounded = self._room.hold(held_to(chunks, limit, lambda: TooLarge(why)), lambda: TooLarge(no_room))
        info = await self._store.put(object_name(request_id), bounded, ttl=self._ttl)
        signed = signed_links.query(self._link_key(), PURPOSE, request_id, self._ttl)
        return f"{self._base_url()}{ROUTE.format(requestId=request_id)}?{signed}", info.size

    def check(self, request_id: str, expires: str | None, signature: str | None) -> None:
        """403 unless the link is ours, for this request, and not expired (checked before any lookup)."""
        signed_links.check(self._link_key(), PURPOSE, request_id, expires, signature, what="download link")

    def open(self, request_id: str) -> AbstractAsyncContextManager[ObjectReader]:
        """The stored zip (BusError when it is gone)."""
        return self._store.open(object_name(request_id))
