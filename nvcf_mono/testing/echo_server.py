"""A small inference server for tests and examples: ``python -m nvcf_mono.testing.echo_server --port P``.

``POST /echo`` answers the JSON body back; ``{"message", "repeats", "delay", "stream"}`` shape the
answer like NVIDIA's echo sample (``stream: true`` sends server-sent events). ``POST /crash``
kills the process mid-request; ``POST /bytes?size=N`` answers N bytes; ``POST /status/<code>``
answers that status. ``/health`` and ``/v2/health/ready`` are the health checks (``/health/fail``
turns them to 503).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os

from aiohttp import web

_state = {"healthy": True}


async def echo(request: web.Request) -> web.StreamResponse:
    raw = await request.read()
    try:
        doc = json.loads(raw) if raw else {}
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or not {"message", "repeats", "delay", "stream"} & set(doc):
        headers = {"X-Echo-Sha256": hashlib.sha256(raw).hexdigest()}
        headers.update({k: v for k, v in request.headers.items() if k.upper().startswith("NVCF-")})
        return web.Response(body=raw, content_type=request.content_type or "application/octet-stream", headers=headers)
    message = str(doc.get("message", ""))
    repeats = int(doc.get("repeats", 1))
    delay = float(doc.get("delay", 0))
    if doc.get("stream"):
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        for i in range(repeats):
            if delay:
                await asyncio.sleep(delay)
            await response.write(f"data: {json.dumps({'index': i, 'message': message})}\n\n".encode())
        await response.write_eof()
        return response
    if delay:
        await asyncio.sleep(delay)
    return web.json_response({"message": message * repeats, "reqid": request.headers.get("NVCF-REQID")})


async def crash(request: web.Request) -> web.Response:
    os._exit(3)


async def sized(request: web.Request) -> web.Response:
    size = int(request.query.get("size", "0"))
    return web.Response(body=os.urandom(size), content_type="application/octet-stream")


async def status(request: web.Request) -> web.Response:
    return web.json_response({"status": int(request.match_info["code"])}, status=int(request.match_info["code"]))


async def health(request: web.Request) -> web.Response:
    return web.json_response({"ok": _state["healthy"]}, status=200 if _state["healthy"] else 503)


async def fail_health(request: web.Request) -> web.Response:
    _state["healthy"] = False
    return web.json_response({"ok": False})


def app() -> web.Application:
    application = web.Application(client_max_size=1024**3)
    application.router.add_post("/echo", echo)
    application.router.add_post("/crash", crash)
    application.router.add_post("/bytes", sized)
    application.router.add_post("/status/{code}", status)
    application.router.add_get("/health", health)
    application.router.add_get("/v2/health/ready", health)
    application.router.add_post("/health/fail", fail_health)
    return application


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=int(os.environ.get("INFERENCE_PORT", "8000")))  # noqa: TID251
    parser.add_argument("--host", default="127.0.0.1")
    args = parser.parse_args()
    web.run_app(app(), host=args.host, port=args.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
