"""A small inference server for tests and examples: ``python -m nvcf_mono.testing.echo_server --port P``.

``POST /echo`` answers the JSON body back; ``{"message", "repeats", "delay", "stream"}`` shape the
answer like NVIDIA's echo sample (``stream: true`` sends server-sent events; ``chunked: true`` sends the
JSON answer in 64 KiB pieces without a Content-Length); ``"progress": [10, 60]``
writes those progress reports to ``<NVCF-LARGE-OUTPUT-DIR>/progress`` first, ``delay`` apart;
``"crash": true`` kills the process mid-request, as ``POST /crash`` does, and ``"break": true`` cuts a
stream's connection after its events (``"garbage"``: after bytes that are not HTTP). A client that hangs up
during the delay is recorded: ``GET /cancelled`` lists those requests' ``NVCF-REQID``.
Raw (non-JSON) bodies come back as they are, with ``X-Echo-Sha256``, the ``NVCF-*`` request headers,
and ``X-Echo-Assets`` (each input asset's digest, read from ``NVCF-ASSET-DIR``).
``POST /bytes?size=N`` answers N random bytes (``X-Echo-Sha256`` is their digest); ``POST
/status/<code>`` answers that status. ``/health`` and ``/v2/health/ready`` are the health checks
(``/health/fail`` turns them to 503, ``/health/recover`` back to 200). Any method on
``/echo-request`` or below answers the request it got as JSON (method, path, query, headers, body,
a per-process call count and the server's pid), or, for a JSON body with ``"answer": {"status", "body", "contentType",
"headers", "delay", "files", "links"}``, exactly that answer, after writing ``files`` (name: text) and
``links`` (name: target) into the request's ``NVCF-LARGE-OUTPUT-DIR``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os

from aiohttp import web

_state = {"healthy": True}
_calls = {"echo-request": 0}
_cancelled: list[str] = []
_KEYS = {"message", "repeats", "delay", "stream", "chunked", "progress", "crash", "break"}


async def _pause(request: web.Request, seconds: float) -> bool:
    """Sleep; False (and the request recorded as cancelled) if the client hangs up meanwhile."""
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while True:
        if request.transport is None or request.transport.is_closing():
            _cancelled.append(request.headers.get("NVCF-REQID", ""))
            return False
        left = end - loop.time()
        if left <= 0:
            return True
        await asyncio.sleep(min(left, 0.02))


def _asset_digests(request: web.Request) -> str:
    """``<asset id>=<sha256 of its file in NVCF-ASSET-DIR>`` for each input asset ("missing" if absent)."""
    directory = request.headers.get("NVCF-ASSET-DIR", "")
    out = []
    for asset_id in request.headers["NVCF-FUNCTION-ASSET-IDS"].split(","):
        try:
            with open(os.path.join(directory, asset_id), "rb") as f:
                out.append(f"{asset_id}={hashlib.sha256(f.read()).hexdigest()}")
        except OSError:
            out.append(f"{asset_id}=missing")
    return ",".join(out)


def _report_progress(request: web.Request, percent: object, step: int) -> None:
    directory = request.headers.get("NVCF-LARGE-OUTPUT-DIR")
    if not directory:
        return
    doc = {"id": request.headers.get("NVCF-REQID"), "progress": percent, "partialResponse": {"step": step}}
    path = os.path.join(directory, "progress")
    with open(path + ".tmp", "w") as f:
        json.dump(doc, f)
    os.replace(path + ".tmp", path)  # never a half-written report


async def echo(request: web.Request) -> web.StreamResponse:
    raw = await request.read()
    try:
        doc = json.loads(raw) if raw else {}
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or not _KEYS & set(doc):
        headers = {"X-Echo-Sha256": hashlib.sha256(raw).hexdigest()}
        headers.update({k: v for k, v in request.headers.items() if k.upper().startswith("NVCF-")})
        if request.headers.get("NVCF-FUNCTION-ASSET-IDS"):
            headers["X-Echo-Assets"] = _asset_digests(request)
        return web.Response(body=raw, content_type=request.content_type or "application/octet-stream", headers=headers)
    if doc.get("crash"):
        os._exit(3)
    message = str(doc.get("message", ""))
    repeats = int(doc.get("repeats", 1))
    delay = float(doc.get("delay", 0))
    for step, percent in enumerate(doc.get("progress") or ()):
        _report_progress(request, percent, step)
        if delay and not await _pause(request, delay):
            return web.Response(status=499)
    if doc.get("stream"):
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        for i in range(repeats):
            if delay:
                await asyncio.sleep(delay)
            await response.write(f"data: {json.dumps({'index': i, 'message': message})}\n\n".encode())
        if doc.get("break") and request.transport is not None:
            await response.drain()
            await asyncio.sleep(0.2)  # the events reach the caller first
            if doc["break"] == "garbage":
                request.transport.write(b"zz\r\n")  # not a chunk's size: the body is not HTTP any more
            request.transport.abort()  # the stream breaks off: no end of the chunked body
            return response
        await response.write_eof()
        return response
    if delay and not await _pause(request, delay):
        return web.Response(status=499)
    answer = {"message": message * repeats, "reqid": request.headers.get("NVCF-REQID")}
    if not doc.get("chunked"):
        return web.json_response(answer)
    body = json.dumps(answer).encode()
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    response.enable_chunked_encoding()  # no Content-Length: a length known only at the end
    await response.prepare(request)
    for start in range(0, len(body), 1 << 16):
        await response.write(body[start : start + (1 << 16)])
    await response.write_eof()
    return response


async def echo_request(request: web.Request) -> web.Response:
    raw = await request.read()
    _calls["echo-request"] += 1
    nvcf = {k: v for k, v in request.headers.items() if k.upper().startswith("NVCF-")}
    try:
        doc = json.loads(raw) if raw else None
    except ValueError:
        doc = None
    answer = doc.get("answer") if isinstance(doc, dict) else None
    if isinstance(answer, dict):
        if answer.get("delay"):
            await asyncio.sleep(float(answer["delay"]))
        _write_outputs(request, dict(answer.get("files") or {}), dict(answer.get("links") or {}))
        headers = {**nvcf, **{str(k): str(v) for k, v in dict(answer.get("headers") or {}).items()}}
        headers["Content-Type"] = str(answer.get("contentType", "text/plain"))
        return web.Response(status=int(answer.get("status", 200)), body=str(answer.get("body", "")), headers=headers)
    seen = {
        "method": request.method,
        "path": request.path,
        "query": request.rel_url.raw_query_string,
        "headers": dict(request.headers),
        "body": raw.decode(errors="replace"),
        "count": _calls["echo-request"],
        "pid": os.getpid(),  # which server (so which instance) answered
    }
    return web.json_response(seen, headers=nvcf)


def _write_outputs(request: web.Request, files: dict[str, str], links: dict[str, str]) -> None:
    """Large outputs for the caller: ``{name: text}`` files and ``{name: target}`` links in NVCF-LARGE-OUTPUT-DIR."""
    if not files and not links:
        return
    base = request.headers["NVCF-LARGE-OUTPUT-DIR"]
    for name, text in files.items():
        path = os.path.join(base, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    for name, target in links.items():
        os.symlink(target, os.path.join(base, name))


async def crash(request: web.Request) -> web.Response:
    os._exit(3)


async def sized(request: web.Request) -> web.Response:
    size = int(request.query.get("size", "0"))
    body = os.urandom(size)
    headers = {"X-Echo-Sha256": hashlib.sha256(body).hexdigest()}
    return web.Response(body=body, content_type="application/octet-stream", headers=headers)


async def status(request: web.Request) -> web.Response:
    return web.json_response({"status": int(request.match_info["code"])}, status=int(request.match_info["code"]))


async def health(request: web.Request) -> web.Response:
    return web.json_response({"ok": _state["healthy"]}, status=200 if _state["healthy"] else 503)


async def fail_health(request: web.Request) -> web.Response:
    _state["healthy"] = False
    return web.json_response({"ok": False})


async def recover_health(request: web.Request) -> web.Response:
    _state["healthy"] = True
    return web.json_response({"ok": True})


async def cancelled(request: web.Request) -> web.Response:
    return web.json_response({"cancelled": _cancelled})


def app() -> web.Application:
    application = web.Application(client_max_size=1024**3)
    application.router.add_post("/echo", echo)
    application.router.add_post("/crash", crash)
    application.router.add_post("/bytes", sized)
    application.router.add_post("/status/{code}", status)
    application.router.add_get("/health", health)
    application.router.add_get("/v2/health/ready", health)
    application.router.add_post("/health/fail", fail_health)
    application.router.add_route("*", "/echo-request{tail:.*}", echo_request)
    application.router.add_post("/health/recover", recover_health)
    application.router.add_get("/cancelled", cancelled)
    return application


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=int(os.environ.get("INFERENCE_PORT", "8000")))  # noqa: TID251
    parser.add_argument("--host", default="127.0.0.1")
    args = parser.parse_args()
    web.run_app(app(), host=args.host, port=args.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
