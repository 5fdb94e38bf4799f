"""Charts fetched from https URLs: trusted CA, basic auth per host, a size cap, https only."""

from __future__ import annotations

import base64
import shutil
from pathlib import Path

import pytest
from aiohttp import web

from nvcf_mono.helm import HelmRenderError, RegistryCredential, RendererOptions, RenderRequest, render_chart
from tests.unit.helm.charts import package, write_chart
from tests.unit.helm.https_server import issue_tls, serving

USER, PASSWORD = "robot", "s3cret-pass"


def _chart_app(archive: bytes) -> web.Application:
    expected = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()

    async def public(request: web.Request) -> web.Response:
        return web.Response(body=archive, content_type="application/gzip")

    async def private(request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != expected:
            return web.Response(status=401, reason="Unauthorized")
        return web.Response(body=archive, content_type="application/gzip")

    async def endless(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()  # no Content-Length: the cap must hold while reading
        await response.prepare(request)
        for _ in range(64):
            await response.write(b"x" * 65536)
        return response

    async def to_http(request: web.Request) -> web.Response:
        raise web.HTTPFound("http://127.0.0.1:1/demo.tgz")

    async def elsewhere(request: web.Request) -> web.Response:
        raise web.HTTPFound(f"https://127.0.0.2:{request.url.port}/charts/demo-1.2.3.tgz")

    app = web.Application()
    app.router.add_get("/charts/demo-1.2.3.tgz", public)
    app.router.add_get("/private/demo-1.2.3.tgz", private)
    app.router.add_get("/endless.tgz", endless)
    app.router.add_get("/redirect.tgz", to_http)
    app.router.add_get("/elsewhere.tgz", elsewhere)
    return app


@pytest.fixture
def archive(tmp_path: Path) -> bytes:
    return package(write_chart(tmp_path / "src"), tmp_path / "dist").read_bytes()


async def test_a_chart_from_an_https_url_renders(tmp_path: Path, archive: bytes) -> None:
    ca_file, context = issue_tls(tmp_path)
    options = RendererOptions(ca_file=ca_file)
    async with serving(_chart_app(archive), context) as base:
        result = await render_chart(
            RenderRequest(chart=f"{base}/charts/demo-1.2.3.tgz", release="web", values={"greeting": "from afar"}),
            renderer="sdk",
            options=options,
        )
        assert (result.chart_name, result.chart_version) == ("demo", "1.2.3")
        config_map = next(obj for obj in result.objects if obj["kind"] == "ConfigMap")
        assert config_map["data"] == {"greeting": "from afar"}
        assert any(s.kind == "CustomResourceDefinition" for s in result.skipped)


async def test_credentials_are_sent_to_their_host_only(tmp_path: Path, archive: bytes) -> None:
    ca_file, context = issue_tls(tmp_path)
    options = RendererOptions(ca_file=ca_file)
    async with serving(_chart_app(archive), context) as base:
        url = f"{base}/private/demo-1.2.3.tgz"
        host = base.removeprefix("https://")
        nothing = rf'^no credential was valid to pull chart "{url}", manually verify credentials are valid$'
        with pytest.raises(HelmRenderError, match=nothing):
            await render_chart(RenderRequest(chart=url), renderer="sdk", options=options)
        other_host = {"registry.example.com": RegistryCredential(USER, PASSWORD)}
        with pytest.raises(HelmRenderError, match=nothing):
            await render_chart(RenderRequest(chart=url, credentials=other_host), renderer="sdk", options=options)
        wrong_then_right = {host: (RegistryCredential(USER, "wrong"), RegistryCredential(USER, PASSWORD))}
        result = await render_chart(
            RenderRequest(chart=url, credentials=wrong_then_right), renderer="sdk", options=options
        )
        assert result.chart_name == "demo"
        mine = {host: RegistryCredential(USER, PASSWORD)}
        result = await render_chart(RenderRequest(chart=url, credentials=mine), renderer="sdk", options=options)
        assert result.chart_name == "demo"


async def test_an_untrusted_certificate_a_large_download_and_a_redirect_to_http_are_refused(
    tmp_path: Path, archive: bytes
) -> None:
    ca_file, context = issue_tls(tmp_path)
    async with serving(_chart_app(archive), context) as base:
        with pytest.raises(HelmRenderError, match=r"cannot download chart .*certificate"):
            await render_chart(RenderRequest(chart=f"{base}/charts/demo-1.2.3.tgz"), renderer="sdk")
        small = RendererOptions(ca_file=ca_file, max_chart_size=1024 * 1024)
        with pytest.raises(HelmRenderError, match=r"endless.tgz: it is larger than 1048576 bytes"):
            await render_chart(RenderRequest(chart=f"{base}/endless.tgz"), renderer="sdk", options=small)
        with pytest.raises(HelmRenderError, match=r"HTTP 404"):
            await render_chart(RenderRequest(chart=f"{base}/nothing.tgz"), renderer="sdk", options=small)
        with pytest.raises(HelmRenderError, match=r"redirected to a non-https URL"):
            await render_chart(RenderRequest(chart=f"{base}/redirect.tgz"), renderer="sdk", options=small)


async def test_a_password_in_the_url_never_reaches_a_message(tmp_path: Path, archive: bytes) -> None:
    ca_file, context = issue_tls(tmp_path)
    async with serving(_chart_app(archive), context) as base:
        url = base.replace("https://", f"https://{USER}:{PASSWORD}@") + "/nothing.tgz"
        with pytest.raises(HelmRenderError) as caught:
            await render_chart(RenderRequest(chart=url), renderer="sdk", options=RendererOptions(ca_file=ca_file))
        assert PASSWORD not in str(caught.value)
        assert "HTTP 404" in str(caught.value)


async def test_a_tenants_chart_comes_only_from_public_addresses_and_the_listed_networks(
    tmp_path: Path, archive: bytes
) -> None:
    # The download is the same code for both renderers; helm where installed.
    for renderer in ["sdk", *(["binary"] if shutil.which("helm") else [])]:
        await _tenant_chart(tmp_path / renderer, archive, renderer)


async def _tenant_chart(tmp_path: Path, archive: bytes, renderer: str) -> None:
    ca_file, context = issue_tls(tmp_path)
    tenant = RendererOptions(ca_file=ca_file, chart_networks=())
    async with serving(_chart_app(archive), context) as base:
        chart = f"{base}/charts/demo-1.2.3.tgz"
        with pytest.raises(HelmRenderError, match=r"127\.0\.0\.1 is a loopback address.*plugins\.helm\.chart_networks"):
            await render_chart(RenderRequest(chart=chart), renderer=renderer, options=tenant)
        # A name is checked as it resolves (its certificate would not even matter: nothing connects).
        named = chart.replace("127.0.0.1", "localhost")
        with pytest.raises(HelmRenderError, match=r"localhost: .*127\.0\.0\.1 is a loopback address"):
            await render_chart(RenderRequest(chart=named), renderer=renderer, options=tenant)
        # The operator lists the network: fetched; a redirect out of it is checked like the first address.
        listed = RendererOptions(ca_file=ca_file, chart_networks=("127.0.0.1/32",))
        result = await render_chart(RenderRequest(chart=chart), renderer=renderer, options=listed)
        assert result.chart_name == "demo"
        with pytest.raises(HelmRenderError, match=r"127\.0\.0\.2 is a loopback address"):
            await render_chart(RenderRequest(chart=f"{base}/elsewhere.tgz"), renderer=renderer, options=listed)
    # An OCI registry is reached through the same client (test_render_oci.py has the rest).
    with pytest.raises(HelmRenderError, match=r"cannot pull chart .*localhost: .*127\.0\.0\.1 is a loopback address"):
        await render_chart(RenderRequest(chart="oci://localhost:5000/charts/demo"), renderer=renderer, options=tenant)
