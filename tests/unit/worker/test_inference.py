"""Calling the inference server: frames as the server writes, the end marked, failures told apart."""

from __future__ import annotations

import json
import os
import time

import anyio
import attrs
import pytest
from aiohttp import web

from nvcf_mono.contracts.frames import Frame, Request
from nvcf_mono.ports import free_port
from nvcf_mono.worker.config import WorkerConfig
from nvcf_mono.worker.http1 import Http1Client
from nvcf_mono.worker.inference import (
    InferenceCrashed,
    InferenceUnreachable,
    call,
    problem_frame,
    request_headers,
)
from tests.unit.worker.servers import aiohttp_server


def config(port: int, *, frame_size: int = 256 * 1024) -> WorkerConfig:
    return WorkerConfig(
        worker_token="t",
        grpc_address="127.0.0.1:1",
        function_id="fid",
        function_version_id="fvid",
        function_name="echo",
        nca_id="nca",
        instance_id="i",
        inference_port=port,
        frame_size=frame_size,
        health_timeout=2.0,
    )


def client(cfg: WorkerConfig) -> Http1Client:
    return Http1Client(cfg.inference_host, cfg.inference_port, connect_timeout=cfg.health_timeout)


def request(path: str, *, asset_ids: tuple[str, ...] = ()) -> Request:
    return Request(
        request_id="req-1",
        nca_id="nca",
        function_id="fid",
        function_version_id="fvid",
        method="POST",
        path=path,
        headers=(("Accept", "*/*"), ("NVCF-REQID", "forged"), ("X-Client", "yes")),
        reply="r",
        time_ms=0,
        deadline_ms=0,
        poll_seconds=60,
        asset_ids=asset_ids,
    )


async def frames_of(port: int, path: str, *, frame_size: int = 256 * 1024) -> list[tuple[float, Frame]]:
    cfg = config(port, frame_size=frame_size)
    out = []
    async with client(cfg) as http:
        with anyio.fail_after(10):
            async for frame in call(http, cfg, request(path), b"", {}, attempt=2):
                out.append((time.monotonic(), frame))
    return out


async def test_a_small_response_is_one_frame_with_its_end() -> None:
    routes = web.RouteTableDef()

    @routes.post("/small")
    async def small(_: web.Request) -> web.Response:
        return web.json_response({"ok": True}, status=201, headers={"X-Thing": "1"})

    async with aiohttp_server(routes) as port:
        frames = [f for _, f in await frames_of(port, "/small")]
    assert len(frames) == 1
    (frame,) = frames
    assert (frame.seq, frame.attempt, frame.status, frame.end) == (0, 2, 201, True)
    assert frame.total_length == len(frame.body)
    assert json.loads(frame.body) == {"ok": True}
    assert dict(frame.headers)["X-Thing"] == "1"


async def test_a_stream_goes_out_as_it_is_written() -> None:
    routes = web.RouteTableDef()
    written: list[float] = []

    @routes.post("/sse")
    async def sse(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for i in range(3):
            await anyio.sleep(0.2)
            written.append(time.monotonic())
            await response.write(f"data: {i}\n\n".encode())
        await response.write_eof()
        return response

    async with aiohttp_server(routes) as port:
        frames = await frames_of(port, "/sse")
    bodies = [f.body for _, f in frames]
    assert b"".join(bodies) == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"
    assert frames[0][1].status == 200 and not frames[0][1].end
    # Each event is passed on before the next is written (not held back for the one after).
    assert frames[0][0] < written[1] and frames[1][0] < written[2]
    assert frames[-1][1].end and frames[-1][1].total_length == sum(map(len, bodies))
    assert [f.seq for _, f in frames] == list(range(len(frames)))


async def test_a_large_body_is_cut_into_full_frames() -> None:
    routes = web.RouteTableDef()
    blob = bytes(range(256)) * 4096 * 3  # 3 MiB

    @routes.post("/large")
    async def large(_: web.Request) -> web.Response:
        return web.Response(body=blob)

    async with aiohttp_server(routes) as port:
        frames = [f for _, f in await frames_of(port, "/large", frame_size=1024 * 1024)]
    assert b"".join(f.body for f in frames) == blob
    assert all(len(f.body) <= 1024 * 1024 for f in frames)
    assert frames[-1].end and frames[-1].total_length == len(blob)
    assert [f.end for f in frames[:-1]] == [False] * (len(frames) - 1)


async def test_a_server_that_is_not_listening_is_unreachable() -> None:
    with pytest.raises(InferenceUnreachable):
        await frames_of(free_port("127.0.0.1"), "/anything")


async def test_a_server_dying_mid_response_is_a_crash() -> None:
    routes = web.RouteTableDef()

    @routes.post("/die")
    async def die(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Length": "1000"})
        await response.prepare(request)
        await response.write(b"x" * 10)
        await response.drain()
        assert request.transport is not None
        request.transport.abort()
        return response

    async with aiohttp_server(routes) as port:
        with pytest.raises(InferenceCrashed) as caught:
            await frames_of(port, "/die")
    assert not isinstance(caught.value, InferenceUnreachable)


def test_worker_errors_are_nvcf_problem_documents() -> None:
    frame = problem_frame("req-1", 3, 500, "Internal error while downloading assets", source="nvcf-worker-service")
    assert (frame.status, frame.seq, frame.attempt, frame.end, frame.problem) == (500, 0, 3, True, None)
    assert dict(frame.headers)["Content-Type"] == "application/problem+json"
    assert json.loads(frame.body) == {
        "type": "urn:nvcf-worker-service:problem-details:internal-server-error",
        "title": "Internal Server Error",
        "status": 500,
        "detail": "Internal error while downloading assets",
    }
    assert frame.total_length == len(frame.body)


def test_request_headers_are_the_clients_plus_the_workers_own() -> None:
    headers = request_headers(
        config(8000), request("/x", asset_ids=("a1", "a2")), asset_dir="/assets/req-1", output_dir="/out/req-1"
    )
    assert headers["NVCF-REQID"] == "req-1"  # the client's forged copy is dropped
    assert headers["X-Client"] == "yes"
    assert headers["NVCF-ASSET-DIR"] == "/assets/req-1"
    assert headers["NVCF-LARGE-OUTPUT-DIR"] == "/out/req-1"
    assert headers["NVCF-FUNCTION-ASSET-IDS"] == "a1,a2"
    assert [k for k in headers if k.lower() == "nvcf-reqid"] == ["NVCF-REQID"]
    # Contract names the worker does not set are dropped too: a caller cannot pose as the platform.
    forged = attrs.evolve(
        request("/x"),
        headers=(("NVCF-Invocation-Region", "forged"), ("nvcf-env", "prod"), ("NVCF-NSPECTID", "forged")),
    )
    sent = request_headers(config(8000), forged, asset_dir="/a", output_dir="/o")
    assert not any(k.lower() in ("nvcf-invocation-region", "nvcf-nspectid") for k in sent)
    # The platform's environment replaces the caller's.
    assert [(k, v) for k, v in sent.items() if k.lower() == "nvcf-env"] == [("NVCF-ENV", "nvcf-mono")]
    # The accepting node's region replaces the caller's.
    recorded = attrs.evolve(forged, invocation_region="eu-north-1")
    sent = request_headers(config(8000), recorded, asset_dir="/a", output_dir="/o")
    assert [(k, v) for k, v in sent.items() if k.lower() == "nvcf-invocation-region"] == [
        ("NVCF-INVOCATION-REGION", "eu-north-1")
    ]


def test_a_request_without_a_content_type_goes_as_json_in_compatibility_mode() -> None:
    def content_type(**changes: object) -> list[str]:
        built = attrs.evolve(request("/x"), **changes)
        sent = request_headers(config(8000), built, asset_dir="/a", output_dir="/o")
        return [v for k, v in sent.items() if k.lower() == "content-type"]

    assert content_type() == ["application/json"]  # NVCF's compatibility mode, on by default
    assert content_type(headers=(("content-type", "text/plain"),)) == ["text/plain"]  # the client's own
    assert content_type(streaming=True) == []  # Accept: text/event-stream: bytes as they are
    assert content_type(headers=(("NVCF-Feature-Disable-Worker-Compatibility", "true"),)) == []


async def test_a_body_already_read_in_full_still_goes_out_whole() -> None:
    routes = web.RouteTableDef()
    blob = os.urandom(100 * 1024)

    @routes.post("/buffered")
    async def buffered(_: web.Request) -> web.Response:
        return web.Response(body=blob)

    async with aiohttp_server(routes) as port:
        frames = [f for _, f in await frames_of(port, "/buffered", frame_size=4096)]
    # The end is only marked once every byte is out, however much sits in the buffer at once.
    assert b"".join(f.body for f in frames) == blob
    assert [f.end for f in frames].index(True) == len(frames) - 1
    assert frames[-1].total_length == len(blob)


async def test_a_cookie_one_caller_got_never_goes_out_with_the_next_callers_request() -> None:
    routes = web.RouteTableDef()

    @routes.post("/login")
    async def login(request: web.Request) -> web.Response:
        # Answers the Cookie header it got, and sets a session cookie for whoever called.
        return web.Response(text=request.headers.get("Cookie", "none"), headers={"Set-Cookie": "session=alice; Path=/"})

    async with aiohttp_server(routes) as port:
        # By host name, as a Kubernetes service or Helm chart is reached (a jar keeps no cookies of IPs).
        cfg = attrs.evolve(config(port), inference_host="localhost")
        seen = []
        async with client(cfg) as http:
            for _ in range(2):
                async for frame in call(http, cfg, request("/login"), b"", {}, attempt=1):
                    seen.append(frame.body)
    assert seen == [b"none", b"none"]
