"""Server-sent-events function, a token streamer like an LLM's: ``python -m nvcf_mono.examples.sse --port 8000``.

``POST /stream`` with ``{"text": "the words to stream", "interval": 0.1, "repeats": 1}`` answers
``text/event-stream``: one event per word, ``interval`` seconds apart, each
``data: {"index": i, "token": "word"}``, then ``data: [DONE]``. Every event has an ``id:`` so a client
can tell where it stopped. Bad input answers 400 with a ``detail``. ``GET /health`` is the health check.

Register it with ``inferenceUrl: /stream``, ``inferencePort: 8000``, ``containerImage: sse``; invoke it
with ``Accept: text/event-stream`` (``nvcf-mono invoke <fid> --stream -d '{"text": "hello there"}'``).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from nvcf_mono.examples import MAX_BODY, arguments
from nvcf_mono.examples.serving import health, serve_http

DEFAULT_TEXT = "The quick brown fox jumps over the lazy dog"
MAX_TOKENS = 100_000
MAX_INTERVAL = 60.0


class BadInput(ValueError):
    """The request body is not a valid stream request."""


def parse(doc: Any) -> tuple[list[str], float]:
    """``(tokens, interval)`` from a request body, or :class:`BadInput`."""
    if not isinstance(doc, dict):
        raise BadInput('the body must be a JSON object such as {"text": "hello there"}')
    text, interval, repeats = doc.get("text", DEFAULT_TEXT), doc.get("interval", 0.1), doc.get("repeats", 1)
    if not isinstance(text, str):
        raise BadInput("'text' must be a string")
    if isinstance(interval, bool) or not isinstance(interval, int | float) or not 0 <= interval <= MAX_INTERVAL:
        raise BadInput(f"'interval' must be a number of seconds from 0 to {MAX_INTERVAL:g}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise BadInput("'repeats' must be a whole number of at least 1")
    tokens = text.split() * repeats
    if len(tokens) > MAX_TOKENS:
        raise BadInput(f"at most {MAX_TOKENS} tokens per request")
    return tokens, float(interval)


def event(index: int, data: str) -> bytes:
    """One server-sent event."""
    return f"id: {index}\ndata: {data}\n\n".encode()


async def stream(request: web.Request) -> web.StreamResponse:
    """Stream the text word by word, then ``[DONE]``."""
    raw = await request.read()
    try:
        tokens, interval = parse(json.loads(raw) if raw.strip() else {})
    except (ValueError, RecursionError) as err:  # BadInput, or a body that is not JSON (or nested too deep)
        detail = str(err) if isinstance(err, BadInput) else f"the body is not JSON: {err}"
        return web.json_response({"title": "Bad Request", "status": 400, "detail": detail}, status=400)
    # Headers go out at once, so the client (and the platform) sees the stream start before the first token.
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    for index, token in enumerate(tokens):
        if index and interval:
            await asyncio.sleep(interval)
        await response.write(event(index, json.dumps({"index": index, "token": token})))
    await response.write(event(len(tokens), "[DONE]"))
    await response.write_eof()
    return response


def app() -> web.Application:
    """The streamer's routes."""
    application = web.Application(client_max_size=MAX_BODY)
    application.router.add_post("/stream", stream)
    application.router.add_get("/health", health)
    return application


def main() -> None:
    """Serve until interrupted."""
    serve_http(app(), arguments(__doc__).parse_args())


if __name__ == "__main__":
    main()
