"""HTTP echo function, like NVIDIA's echo sample: ``python -m nvcf_mono.examples.echo --port 8000``.

``POST /echo`` with ``{"message": "hi", "repeats": 3, "delay": 0.5, "stream": false}`` answers
``{"message": "hihihi", "reqid": "<NVCF-REQID>"}`` after ``delay`` seconds; with ``"stream": true`` it
sends ``repeats`` server-sent events instead, ``delay`` apart, each ``{"index": i, "message": ...}``.
Bad input answers 400 with a ``detail``. ``GET /health`` (and Triton's ``/v2/health/ready``) is the
health check.

Register it as a function with ``inferenceUrl: /echo``, ``inferencePort: 8000``,
``containerImage: echo`` and ``health: {protocol: HTTP, uri: /health, port: 8000}``.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from nvcf_mono.examples import MAX_BODY, arguments
from nvcf_mono.examples.serving import health, serve_http

MAX_REPEATS = 10_000
MAX_DELAY = 600.0


class BadInput(ValueError):
    """The request body is not a valid echo request."""


def parse(doc: Any) -> tuple[str, int, float, bool]:
    """``(message, repeats, delay, stream)`` from a request body, or :class:`BadInput`."""
    if not isinstance(doc, dict):
        raise BadInput('the body must be a JSON object such as {"message": "hello"}')
    message, repeats, delay, stream = (
        doc.get("message", ""),
        doc.get("repeats", 1),
        doc.get("delay", 0),
        doc.get("stream", False),
    )
    if not isinstance(message, str):
        raise BadInput("'message' must be a string")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or not 0 <= repeats <= MAX_REPEATS:
        raise BadInput(f"'repeats' must be a whole number from 0 to {MAX_REPEATS}")
    if isinstance(delay, bool) or not isinstance(delay, int | float) or not 0 <= delay <= MAX_DELAY:
        raise BadInput(f"'delay' must be a number of seconds from 0 to {MAX_DELAY:g}")
    if not isinstance(stream, bool):
        raise BadInput("'stream' must be true or false")
    return message, repeats, float(delay), stream


async def echo(request: web.Request) -> web.StreamResponse:
    """Answer the message, ``repeats`` times, after ``delay`` seconds (or stream it)."""
    raw = await request.read()
    try:
        message, repeats, delay, stream = parse(json.loads(raw) if raw.strip() else {})
    except (ValueError, RecursionError) as err:  # BadInput, or a body that is not JSON (or nested too deep)
        detail = str(err) if isinstance(err, BadInput) else f"the body is not JSON: {err}"
        return web.json_response({"title": "Bad Request", "status": 400, "detail": detail}, status=400)
    if stream:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        for index in range(repeats):
            if delay:
                await asyncio.sleep(delay)
            await response.write(f"data: {json.dumps({'index': index, 'message': message})}\n\n".encode())
        await response.write_eof()
        return response
    await asyncio.sleep(delay)
    # NVCF-REQID is the platform's id for this request (see the worker's header contract).
    return web.json_response({"message": message * repeats, "reqid": request.headers.get("NVCF-REQID")})


def app() -> web.Application:
    """The echo server's routes."""
    application = web.Application(client_max_size=MAX_BODY)
    application.router.add_post("/echo", echo)
    application.router.add_get("/health", health)
    application.router.add_get("/v2/health/ready", health)
    return application


def main() -> None:
    """Serve until interrupted."""
    serve_http(app(), arguments(__doc__).parse_args())


if __name__ == "__main__":
    main()
