"""One trace from the caller to the function, across the platform's and the worker's processes.

The spans go to a real OTLP/HTTP endpoint on loopback: an aiohttp server that decodes the
protobuf export requests as a collector would. The function (the mirror) answers with the headers
it got, so the test also sees the ``traceparent`` it was called with.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from nvcf_mono import tracing
from nvcf_mono.testing.platform import wait_for
from nvcf_mono.testing.running import ECHO_FUNCTION, deployed, launching_agent, platform

pytestmark = pytest.mark.slow
MIRROR = {**ECHO_FUNCTION, "name": "mirror", "inferenceUrl": "/echo-request"}
CLIENT_TRACE, CLIENT_SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"


@asynccontextmanager
async def otlp_receiver() -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    """An OTLP/HTTP traces endpoint on 127.0.0.1; yields its base URL and the spans it received."""
    spans: list[dict[str, Any]] = []

    async def export(request: web.Request) -> web.Response:
        assert request.content_type == "application/x-protobuf"
        body = ExportTraceServiceRequest.FromString(await request.read())
        for resource_spans in body.resource_spans:
            attributes = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            for scope in resource_spans.scope_spans:
                for span in scope.spans:
                    spans.append(
                        {
                            "service": attributes.get("service.name"),
                            "name": span.name,
                            "trace": span.trace_id.hex(),
                            "id": span.span_id.hex(),
                            "parent": span.parent_span_id.hex(),
                            "attributes": {a.key: a.value for a in span.attributes},
                        }
                    )
        reply = ExportTraceServiceResponse().SerializeToString()
        return web.Response(body=reply, content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_post("/v1/traces", export)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}", spans
    finally:
        await runner.cleanup()


async def test_one_trace_runs_from_the_caller_through_platform_and_worker_to_the_function(tmp_path: Path) -> None:
    settings = {"tracing.export_delay": 0.1}
    async with otlp_receiver() as (url, spans):
        async with (
            platform(tmp_path, **{"tracing.otlp_endpoint": url, **settings}) as p,
            launching_agent(p, tmp_path / "instances"),
        ):
            assert tracing.enabled()
            fid, _ = await deployed(p.admin, MIRROR)
            traceparent = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
            reply = await p.key.post(f"/v2/nvcf/pexec/functions/{fid}", {"hi": 1}, headers={"traceparent": traceparent})
            assert reply.status == 200, reply.body
            seen = {k.lower(): v for k, v in reply.json["headers"].items()}
            _, trace_id, parent_id, flags = seen["traceparent"].split("-")
            assert trace_id == CLIENT_TRACE and flags == "01"  # the function's spans join the caller's trace

            names = {
                "POST /v2/nvcf/pexec/functions/{functionId}",
                "enqueue",
                "deliver",
                "relay",
                "serve",
                "call POST",
            }

            async def traced() -> dict[str, dict[str, Any]] | None:
                mine = {s["name"]: s for s in spans if s["trace"] == CLIENT_TRACE}
                return mine if names <= set(mine) else None

            found = await wait_for(traced, timeout=20, what=f"the spans {sorted(names)}")
        assert not tracing.enabled(), "the host's stop ends tracing"

    intake = found["POST /v2/nvcf/pexec/functions/{functionId}"]
    assert intake["parent"] == CLIENT_SPAN and intake["service"] == "nvcf-mono"
    assert found["enqueue"]["parent"] == intake["id"]
    assert found["relay"]["parent"] == intake["id"]
    assert found["deliver"]["parent"] == found["enqueue"]["id"] and found["deliver"]["service"] == "nvcf-mono"
    serve, call = found["serve"], found["call POST"]
    assert serve["parent"] == found["enqueue"]["id"] and serve["service"] == "nvcf-mono-worker"
    assert call["parent"] == serve["id"] and call["service"] == "nvcf-mono-worker"
    assert parent_id == call["id"], "the function is called as the child of the worker's call span"
    assert intake["attributes"]["nvcf.function_id"].string_value == fid
    assert intake["attributes"]["http.response.status_code"].int_value == 200
