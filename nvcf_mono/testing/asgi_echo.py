"""A plain ASGI echo app, for ``uvicorn nvcf_mono.testing.asgi_echo:app --workers 2`` (the benchmark's
production-style inference server): ``POST /echo`` answers its body back, ``/health`` answers 200.

It writes the response head and body as two ASGI messages, as most frameworks do, so a path that
meets it with Nagle's algorithm and delayed ACKs would show it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]


async def app(
    scope: Scope, receive: Callable[[], Awaitable[Message]], send: Callable[[Message], Awaitable[None]]
) -> None:
    if scope["type"] != "http":
        return  # lifespan: nothing to set up
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    body = b"ok" if scope["path"] == "/health" else b"".join(chunks)
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})
