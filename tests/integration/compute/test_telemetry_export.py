"""A function's telemetries, end to end: a real instance (local backend) sends its traces, metrics and
log to the account's endpoint, an OTLP/HTTP receiver on loopback that decodes what it gets as a
collector would and checks the credential it was given.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import attrs
import pytest
from aiohttp import web
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from nvcf_mono.testing.platform import wait_for, wait_status
from tests.http_proxy import http_proxy

from .conftest import CLUSTER_A, all_gone, compute_platform, create, deploy, environ_of, function, pids, running, spec
from .test_tasks_local import finished, get_task, launch, task_body, task_platform

pytestmark = pytest.mark.slow
TOKEN = "tenant-OTLP-token-7"
CLIENT_TRACE = "5bf92f3577b34da6a3ce929d0e0e4736"
#: The receivers run on loopback, which the operator must allow (public addresses only, by default).
LOOPBACK = {"plugins.control.telemetry_networks": '["127.0.0.0/8"]'}
#: The echo server, printing a line every 0.3 s (its output, which the agent sends to the logs endpoint).
CHATTY = json.dumps(
    [
        "{python}",
        "-u",
        "-c",
        "import os, runpy, sys, threading, time; threading.Thread(target=lambda: [print('tick') or time.sleep(0.3)"
        " for _ in iter(int, 1)], daemon=True).start(); sys.argv = ['echo', '--port', os.environ['PORT']];"
        " runpy.run_module('nvcf_mono.testing.echo_server', run_name='__main__')",
    ]
)


@attrs.define
class Received:
    """What the receiver got, by signal; and every Authorization header it was sent."""

    spans: list[dict[str, Any]] = attrs.Factory(list)
    points: list[dict[str, Any]] = attrs.Factory(list)
    records: list[dict[str, Any]] = attrs.Factory(list)
    auth: set[str] = attrs.Factory(set)
    #: The tokens it takes (a test rotating the secret adds the new one).
    tokens: set[str] = attrs.Factory(lambda: {TOKEN})
    #: The Authorization headers of each signal's exports.
    auth_of: dict[str, set[str]] = attrs.Factory(dict)


def _attributes(items: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for a in items:
        kind = a.value.WhichOneof("value")
        out[a.key] = getattr(a.value, kind) if kind else None
    return out


@asynccontextmanager
async def otlp_receiver() -> AsyncIterator[tuple[str, Received]]:
    """An OTLP/HTTP collector under ``/collector`` on 127.0.0.1 that takes only the tenant's token."""
    got = Received()

    def traces(body: bytes) -> None:
        for rs in ExportTraceServiceRequest.FromString(body).resource_spans:
            resource = _attributes(rs.resource.attributes)
            for scope in rs.scope_spans:
                for span in scope.spans:
                    attributes = _attributes(span.attributes)
                    got.spans.append(
                        {"name": span.name, "trace": span.trace_id.hex(), "resource": resource, **attributes}
                    )

    def metrics(body: bytes) -> None:
        for rm in ExportMetricsServiceRequest.FromString(body).resource_metrics:
            resource = _attributes(rm.resource.attributes)
            for scope in rm.scope_metrics:
                for metric in scope.metrics:
                    summed = metric.HasField("sum")
                    for point in (metric.sum if summed else metric.histogram).data_points:
                        value = point.as_int if summed else point.count
                        attributes = _attributes(point.attributes)
                        got.points.append({"name": metric.name, "value": value, "resource": resource, **attributes})

    def logs(body: bytes, auth: str) -> None:
        for rl in ExportLogsServiceRequest.FromString(body).resource_logs:
            resource = _attributes(rl.resource.attributes)
            for scope in rl.scope_logs:
                got.records.extend(
                    {"body": r.body.string_value, "resource": resource, "auth": auth} for r in scope.log_records
                )

    def receiver(signal: str, decode: Callable[..., None]) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def export(request: web.Request) -> web.Response:
            auth = request.headers.get("Authorization", "")
            got.auth.add(auth)
            got.auth_of.setdefault(signal, set()).add(auth)
            if auth not in {f"Bearer {token}" for token in got.tokens}:
                return web.Response(status=401)
            if decode is logs:
                logs(await request.read(), auth)
            else:
                decode(await request.read())
            return web.Response(content_type="application/x-protobuf")

        return export

    app = web.Application()
    for signal, decode in (("traces", traces), ("metrics", metrics), ("logs", logs)):
        app.router.add_post(f"/collector/v1/{signal}", receiver(signal, decode))
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/collector", got
    finally:
        await runner.cleanup()


async def telemetry_endpoint(admin: Any, url: str, *types: str, name: str = "collector") -> str:
    """Register ``url`` as the account's OTLP/HTTP endpoint for ``types``, with the tenant's token; its id."""
    made = await admin.post(
        "/v2/nvcf/telemetries",
        {
            "endpoint": url,
            "protocol": "HTTP",
            "provider": "OTEL_COLLECTOR",
            "types": list(types),
            "secret": {"name": name, "value": TOKEN},
        },
    )
    assert made.status == 200, made.body
    return str(made.json["telemetry"]["telemetryId"])


async def test_an_instance_sends_its_traces_metrics_and_log_to_the_functions_endpoint(tmp_path: Path) -> None:
    async with otlp_receiver() as (url, got), compute_platform(tmp_path, **LOOPBACK) as p:
        tid = await telemetry_endpoint(p.admin, url, "TRACES", "METRICS", "LOGS")
        chosen = {"tracesTelemetryId": tid, "metricsTelemetryId": tid, "logsTelemetryId": tid}
        fid, vid, d = await create(
            p.admin,
            function(telemetries=chosen, containerEnvironment=[{"key": "OTEL_SERVICE_NAME", "value": "my-echo"}]),
        )
        await deploy(p.admin, d, spec())
        await wait_status(p.admin, d, "ACTIVE")
        traceparent = f"00-{CLIENT_TRACE}-00f067aa0ba902b7-01"
        reply = await p.key.post(
            f"/v2/nvcf/pexec/functions/{fid}", {"message": "hi"}, headers={"traceparent": traceparent}
        )
        assert reply.status == 200, reply.body

        # The function's own SDK is pointed at the endpoint; its own setting wins; the worker's
        # receivers (with the credential) stay out of the function's environment.
        (view,) = await running(p.bus, CLUSTER_A)
        procs = {proc.role: proc.pid for proc in view.instance.processes}
        inference, worker = environ_of(procs["inference"]), environ_of(procs["worker"])
        assert inference["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] == f"{url}/v1/traces"
        assert inference["OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"] == f"{url}/v1/metrics"
        assert inference["OTEL_EXPORTER_OTLP_LOGS_HEADERS"] == f"Authorization=Bearer%20{TOKEN}"
        assert inference["OTEL_SERVICE_NAME"] == "my-echo"
        assert "NVCF_TELEMETRY_EXPORTS" not in inference
        exports = json.loads(worker["NVCF_TELEMETRY_EXPORTS"])
        assert set(exports) == {"traces", "metrics", "logs"}
        # The worker connects to the endpoint only at public addresses and in the operator's networks.
        assert all(target["networks"] == ["127.0.0.0/8"] for target in exports.values())

        async def served() -> dict[str, Any] | None:
            return next((s for s in got.spans if s["name"] == "serve" and s["trace"] == CLIENT_TRACE), None)

        serve = await wait_for(served, timeout=20, what="the worker's serve span at the endpoint")
        assert serve["resource"]["nvcf.function_id"] == fid and serve["resource"]["service.name"] == "nvcf-mono-worker"
        assert serve["nvcf.instance_id"] == view.instance.instance_id

        async def logged() -> bool:
            return any(r["resource"].get("service.instance.id") == view.instance.instance_id for r in got.records)

        await wait_for(logged, timeout=20, what="the worker's log records at the endpoint")

        # The server's own output (stdout and stderr), line by line, as the function's.
        output = (Path(view.instance.directory or "") / "inference.log").read_text().splitlines()
        first = next(line for line in output if line.strip())

        async def shipped() -> bool:
            return any(
                r["body"] == first
                and r["resource"].get("service.name") == "echo"
                and r["resource"].get("nvcf.function_id") == fid
                and r["resource"].get("service.instance.id") == view.instance.instance_id
                for r in got.records
            )

        await wait_for(shipped, timeout=20, what=f"the server's output line {first!r} at the endpoint")

        # The last metrics go out as the worker stops.
        found = pids([view])
        assert (await p.admin.delete(d)).status == 200
        await all_gone(found)

        async def counted() -> list[dict[str, Any]] | None:
            mine = [
                point
                for point in got.points
                if point["name"] == "nvcf.worker.requests" and point["resource"].get("nvcf.function_version_id") == vid
            ]
            return mine or None

        points = await wait_for(counted, timeout=20, what="the instance's request count at the endpoint")
        assert max(pt["value"] for pt in points if pt.get("http.response.status_code") == 200) == 1
        assert any(pt["name"] == "nvcf.worker.request.duration" for pt in got.points)
        assert got.auth == {f"Bearer {TOKEN}"}, "every export carried the tenant's token, and only it"


async def test_a_replaced_secret_reaches_the_running_instances_exports(tmp_path: Path) -> None:
    """PUT /v2/nvcf/secrets/telemetries/{id} while an instance runs: within the refresh interval its worker's
    exports and the agent sending its output carry the new token, without a restart.
    """
    settings = {**LOOPBACK, "plugins.compute.local.secrets_refresh": "0.5", "images.chatty.command": CHATTY}
    async with otlp_receiver() as (url, got), compute_platform(tmp_path, **settings) as p:
        tid = await telemetry_endpoint(p.admin, url, "TRACES", "LOGS")
        chosen = {"tracesTelemetryId": tid, "logsTelemetryId": tid}
        fid, _, d = await create(p.admin, function("chatty", containerImage="chatty", telemetries=chosen))
        await deploy(p.admin, d, spec())
        await wait_status(p.admin, d, "ACTIVE")
        assert (await p.key.post(f"/v2/nvcf/pexec/functions/{fid}", {"message": "before"})).status == 200
        (view,) = await running(p.bus, CLUSTER_A)
        pid = pids([view])
        rotated = "tenant-OTLP-token-8"
        got.tokens.add(rotated)
        put = await p.admin.put(
            f"/v2/nvcf/secrets/telemetries/{tid}", {"secret": {"name": "collector", "value": rotated}}
        )
        assert put.status == 204, put.body

        async def sent_with(service: str) -> bool:
            return any(
                r["auth"] == f"Bearer {rotated}" and r["resource"].get("service.name") == service for r in got.records
            )

        # The worker's own log (its lines about calls), and the server's output the agent sends.
        for i in range(40):
            reply = await p.key.post(f"/v2/nvcf/pexec/functions/{fid}", {"message": f"after-{i}"})
            assert reply.status == 200, reply.body
            if await sent_with("nvcf-mono-worker") and await sent_with("chatty"):
                break
            await anyio.sleep(0.5)
        await wait_for(lambda: sent_with("nvcf-mono-worker"), timeout=10, what="the worker's log with the new token")
        await wait_for(lambda: sent_with("chatty"), timeout=10, what="the server's output with the new token")

        async def traced() -> bool:
            return f"Bearer {rotated}" in got.auth_of.get("traces", set())

        await wait_for(traced, timeout=10, what="the worker's spans with the new token")
        (again,) = await running(p.bus, CLUSTER_A)
        assert pids([again]) == pid, "the same processes: nothing was restarted"
        assert got.auth <= {f"Bearer {TOKEN}", f"Bearer {rotated}"}


async def test_a_tasks_worker_log_and_its_programs_sdk_go_to_the_tasks_endpoint(tmp_path: Path) -> None:
    async with otlp_receiver() as (url, got), task_platform(tmp_path, **LOOPBACK) as (p, _):
        tid = await telemetry_endpoint(p.admin, url, "LOGS", "TRACES")
        chosen = {"logsTelemetryId": tid, "tracesTelemetryId": tid}
        task_id = await launch(p.admin, task_body("observed", "--steps 100 --otel-result", telemetries=chosen))
        assert (await get_task(p.admin, task_id))["telemetries"] == chosen
        # Unfinished (queued a moment ago: its process has yet to start), it holds its endpoint.
        busy = await p.admin.delete(f"/v2/nvcf/telemetries/{tid}")
        assert busy.status == 400 and f"in use by Task id '{task_id}'" in busy.detail, busy.body
        task = await finished(p.admin, task_id)
        assert task["status"] == "COMPLETED", task

        results = (await p.admin.get(f"/v1/nvct/tasks/{task_id}/results")).json["results"]
        (otel,) = (r for r in results if r["name"] == "otel.json")
        content = await p.admin.get(f"/v1/nvct/tasks/{task_id}/results/{otel['resultId']}/content")
        variables = json.loads(content.body)
        assert variables["OTEL_EXPORTER_OTLP_LOGS_ENDPOINT"] == f"{url}/v1/logs"
        assert variables["OTEL_EXPORTER_OTLP_TRACES_HEADERS"] == f"Authorization=Bearer%20{TOKEN}"
        assert variables["OTEL_METRICS_EXPORTER"] == "none" and variables["OTEL_SERVICE_NAME"] == "observed"
        assert f"nvct.task_id={task_id}" in variables["OTEL_RESOURCE_ATTRIBUTES"]

        async def uploaded() -> bool:
            return any(
                "uploaded result otel.json" in r["body"] and r["resource"].get("nvct.task_id") == task_id
                for r in got.records
            )

        await wait_for(uploaded, timeout=20, what="the task worker's log at the endpoint")

        async def printed() -> bool:  # what the program printed, sent as it ended
            return any(
                r["body"] == "progress 100" and r["resource"].get("nvct.task_id") == task_id for r in got.records
            )

        await wait_for(printed, timeout=20, what="the task program's output at the endpoint")
        assert got.auth == {f"Bearer {TOKEN}"}
        # Finished, the task no longer holds its endpoint.
        assert (await p.admin.delete(f"/v2/nvcf/telemetries/{tid}")).status == 204


async def test_an_endpoint_that_never_answers_costs_the_function_nothing(tmp_path: Path) -> None:
    """A tenant's collector that takes connections and never replies: calls are answered as ever, and
    the instance still stops within its grace period (the worker's last exports give up)."""
    hung = anyio.Event()

    async def never(request: web.Request) -> web.Response:
        hung.set()
        await anyio.sleep(3600)
        return web.Response()

    app = web.Application()
    app.router.add_post("/v1/{signal}", never)
    runner = web.AppRunner(app, shutdown_timeout=0.5)  # its requests never end: do not wait for them
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        async with compute_platform(tmp_path, **LOOPBACK) as p:
            hole = f"http://127.0.0.1:{runner.addresses[0][1]}"
            tid = await telemetry_endpoint(p.admin, hole, "TRACES", "METRICS", "LOGS", name="black-hole")
            chosen = {"tracesTelemetryId": tid, "metricsTelemetryId": tid, "logsTelemetryId": tid}
            fid, _, d = await create(p.admin, function(telemetries=chosen))
            await deploy(p.admin, d, spec())
            await wait_status(p.admin, d, "ACTIVE")
            for n in range(20):
                with anyio.fail_after(5):
                    reply = await p.key.post(f"/v2/nvcf/pexec/functions/{fid}", {"message": str(n)})
                assert reply.status == 200 and reply.json["message"] == str(n), reply.body
            with anyio.fail_after(20):
                await hung.wait()  # the exports did go out, and hang there
            found = pids(await running(p.bus, CLUSTER_A))
            assert (await p.admin.delete(d)).status == 200
            await all_gone(found, timeout=30)
    finally:
        await runner.cleanup()


async def test_through_the_operators_proxy_the_worker_and_the_agent_reach_the_endpoint(tmp_path: Path) -> None:
    async with otlp_receiver() as (url, got), http_proxy() as proxy:
        settings = {**LOOPBACK, "plugins.compute.telemetry_proxy": proxy.url}
        async with compute_platform(tmp_path, **settings) as p:
            tid = await telemetry_endpoint(p.admin, url, "TRACES", "LOGS")
            fid, _, d = await create(p.admin, function(telemetries={"tracesTelemetryId": tid, "logsTelemetryId": tid}))
            await deploy(p.admin, d, spec())
            await wait_status(p.admin, d, "ACTIVE")
            assert (await p.key.post(f"/v2/nvcf/pexec/functions/{fid}", {"message": "hi"})).status == 200
            (view,) = await running(p.bus, CLUSTER_A)
            procs = {proc.role: proc.pid for proc in view.instance.processes}
            assert environ_of(procs["worker"])["NVCF_TELEMETRY_PROXY"] == proxy.url
            assert "NVCF_TELEMETRY_PROXY" not in environ_of(procs["inference"])

            async def both_came() -> bool:
                spans = any(s["name"] == "serve" for s in got.spans)  # the worker's exporter
                shipped = any(r["resource"].get("service.name") == "echo" for r in got.records)  # the agent's
                return spans and shipped

            await wait_for(both_came, timeout=30, what="the worker's spans and the agent's shipped output")
            receiver = url.split("//", 1)[1].split("/", 1)[0]
            assert {target for _, target in proxy.seen} == {receiver}
            assert (await p.admin.delete(d)).status == 200
