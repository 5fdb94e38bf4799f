"""A tenant's telemetry endpoint is reached only at allowed addresses, checked when the connection is made:
the worker's exporters (OpenTelemetry's OTLP/HTTP exporter with the checked session) and the agent's
log shipping, each against real receivers on loopback addresses.

A name stands in for one that resolves elsewhere later (DNS rebinding): ``localhost`` passes no check
that looks at the URL alone, so only the check at connection time keeps it out.
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest
import requests
from aiohttp import web
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from nvcf_mono.planes.compute.log_shipping import LogShipper
from nvcf_mono.testing.platform import wait_for
from nvcf_mono.tracing import OtlpTarget
from tests.http_proxy import http_proxy


@asynccontextmanager
async def receiver(host: str = "127.0.0.1", redirect: str | None = None) -> AsyncIterator[tuple[int, list[str]]]:
    """An HTTP receiver on ``host``: its port, and the paths posted to it; ``redirect``: answer 307 there."""
    got: list[str] = []

    async def take(request: web.Request) -> web.StreamResponse:
        await request.read()
        got.append(request.path)
        if redirect is not None:
            raise web.HTTPTemporaryRedirect(redirect)
        return web.Response()

    app = web.Application()
    app.router.add_post("/{tail:.*}", take)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, host, 0)
    await site.start()
    try:
        yield runner.addresses[0][1], got
    finally:
        await runner.cleanup()


def export_span(target: OtlpTarget) -> SpanExportResult:
    """One span through the worker's exporter to ``target`` (blocking: the exporter is)."""
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    provider.get_tracer("test").start_span("call").end()
    exporter = OTLPSpanExporter(endpoint=target.url, timeout=1, session=target.session())
    try:
        return exporter.export(spans.get_finished_spans())
    finally:
        exporter.shutdown()


async def test_the_workers_exporter_connects_only_to_allowed_addresses() -> None:
    async with receiver() as (port, got):
        url = f"http://localhost:{port}/v1/traces"
        refused = await anyio.to_thread.run_sync(export_span, OtlpTarget(url, networks=()))
        assert refused is SpanExportResult.FAILURE and got == []
        allowed = await anyio.to_thread.run_sync(export_span, OtlpTarget(url, networks=("127.0.0.0/8",)))
        assert allowed is SpanExportResult.SUCCESS and got == ["/v1/traces"]
        # The operator's own collector (no networks): the exporter's own session, unchecked.
        assert await anyio.to_thread.run_sync(export_span, OtlpTarget(url)) is SpanExportResult.SUCCESS


async def test_a_redirect_is_checked_like_the_first_address() -> None:
    async with receiver("127.0.0.2") as (port, elsewhere):
        target = f"http://127.0.0.2:{port}/v1/traces"
        async with receiver(redirect=target) as (first_port, first):
            url = f"http://127.0.0.1:{first_port}/v1/traces"
            # The exporter itself follows no redirect, even to an allowed address.
            both = OtlpTarget(url, networks=("127.0.0.0/8",))
            await anyio.to_thread.run_sync(export_span, both)
            assert first == ["/v1/traces"] and elsewhere == []

            # The session would (requests' default), and checks the new address as it connects.
            def post(target: OtlpTarget) -> int:
                with target.session() as session:
                    return session.post(url, data=b"x", timeout=5).status_code

            with pytest.raises(requests.ConnectionError, match=re.escape("127.0.0.2 is a loopback address")):
                await anyio.to_thread.run_sync(post, OtlpTarget(url, networks=("127.0.0.1/32",)))
            assert len(first) == 2 and elsewhere == []
            assert await anyio.to_thread.run_sync(post, both) == 200  # so the refusal above was the check's
            assert elsewhere == ["/v1/traces"]


@pytest.mark.parametrize(
    ("host", "networks", "sent"),
    [
        ("localhost", (), False),  # a name that resolves to loopback
        ("127.0.0.1", (), False),  # an address aiohttp does not resolve
        ("localhost", ("127.0.0.0/8",), True),
    ],
)
async def test_the_agents_log_shipping_connects_only_to_allowed_addresses(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, host: str, networks: tuple[str, ...], sent: bool
) -> None:
    log = tmp_path / "inference.log"
    log.write_text("the function's first line\n")
    shipper = LogShipper(logging.getLogger("test.shipping"))
    async with receiver("127.0.0.2") as (other_port, elsewhere):
        redirect = f"http://127.0.0.2:{other_port}/v1/logs"
        async with receiver(redirect=redirect) as (port, got), anyio.create_task_group() as tg:
            await tg.start(shipper.run)
            target = OtlpTarget(f"http://{host}:{port}/v1/logs", networks=networks)
            shipper.watch("inst-1", log, target, {"service.name": "echo"}, from_end=False)
            shipper.forget("inst-1")  # one round, then done

            async def warned() -> str | None:
                return next((r.getMessage() for r in caplog.records if "could not be sent" in r.getMessage()), None)

            warning = await wait_for(warned, timeout=10, what="the shipping round's outcome")
            tg.cancel_scope.cancel()
    if sent:
        # Delivered, and answered with a redirect that is not followed (a tenant's endpoint sends nowhere else).
        assert got == ["/v1/logs"] and elsewhere == [] and "HTTP 307" in warning
    else:
        assert got == [] and "127.0.0.1 is a loopback address" in warning


async def test_through_the_operators_proxy_what_can_be_checked_here_is_checked_first() -> None:
    async with receiver() as (port, got), http_proxy() as proxy:
        url = f"http://127.0.0.1:{port}/v1/traces"
        listed = OtlpTarget(url, networks=("127.0.0.0/8",), proxy=proxy.url)
        assert await anyio.to_thread.run_sync(export_span, listed) is SpanExportResult.SUCCESS
        assert got == ["/v1/traces"] and proxy.seen == [("POST", f"127.0.0.1:{port}")]
        # An address, or a name that resolves here only to refused addresses: never handed to the proxy.
        for host in ("127.0.0.1", "localhost"):
            refused = OtlpTarget(f"http://{host}:{port}/v1/traces", networks=(), proxy=proxy.url)
            assert await anyio.to_thread.run_sync(export_span, refused) is SpanExportResult.FAILURE
        assert len(proxy.seen) == 1 and got == ["/v1/traces"]

        # A name that does not resolve here (as behind many proxies) is the proxy's to resolve and judge.
        def post(target: OtlpTarget) -> int:
            with target.session() as session:
                return session.post(target.url, data=b"x", timeout=5).status_code

        unknown = OtlpTarget("http://collector.nvcf-test.invalid/v1/traces", networks=(), proxy=proxy.url)
        proxy.refuse = True  # it answers 502 without looking the name up: only this side resolves it
        assert await anyio.to_thread.run_sync(post, unknown) == 502
        assert proxy.seen[-1] == ("POST", "collector.nvcf-test.invalid:80")


async def test_the_agents_log_shipping_goes_through_the_operators_proxy(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = tmp_path / "inference.log"
    log.write_text("the function's first line\n")
    async with receiver() as (port, got), http_proxy() as proxy, anyio.create_task_group() as tg:
        shipper = LogShipper(logging.getLogger("test.shipping"), proxy.url)
        await tg.start(shipper.run)
        target = OtlpTarget(f"http://localhost:{port}/v1/logs", networks=("127.0.0.0/8",))
        shipper.watch("inst-1", log, target, {"service.name": "echo"}, from_end=False)
        shipper.forget("inst-1")

        async def delivered() -> bool:
            return bool(got)

        await wait_for(delivered, timeout=10, what="the lines")
        assert got == ["/v1/logs"] and proxy.seen == [("POST", f"localhost:{port}")]
        # Not listed: refused here, the proxy never asked.
        refused = OtlpTarget(f"http://localhost:{port}/v1/logs", networks=())
        shipper.watch("inst-2", log, refused, {"service.name": "echo"}, from_end=False)
        shipper.forget("inst-2")

        async def warned() -> str | None:
            return next((r.getMessage() for r in caplog.records if "could not be sent" in r.getMessage()), None)

        warning = await wait_for(warned, timeout=10, what="the refusal")
        assert "127.0.0.1" in warning and "loopback" in warning and len(proxy.seen) == 1
        tg.cancel_scope.cancel()
