"""The ``helm`` plugin in a running host: it picks a renderer, and other plugins render through it."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import anyio
import pytest
from anyio.abc import TaskStatus

from nvcf_mono.helm import (
    CHART_RENDERER,
    HELM_RENDERERS,
    ChartRenderer,
    HelmRenderError,
    RenderedChart,
    RendererOptions,
    RenderRequest,
)
from nvcf_mono.host import Host, HostFailed
from nvcf_mono.plugin import BasePlugin, NoConfig, PluginSpec, RunContext, SetupContext
from nvcf_mono.testing.host import config_for_test, running_host
from nvcf_mono.testing.nats_server import NatsServer
from tests.unit.helm.charts import write_chart

RESULTS: list[RenderedChart] = []


class ListingRenderer:
    """A renderer of its own: lists the chart's files instead of rendering them."""

    name = "listing"

    async def render(self, request: RenderRequest) -> RenderedChart:
        files = _files(Path(request.chart))
        return RenderedChart(
            chart_name="listing", chart_version="0", objects=({"files": files},), skipped=(), renderer=self.name
        )


def _files(chart: Path) -> list[str]:
    return sorted(p.name for p in chart.rglob("*") if p.is_file())


class ListingProvider:
    name = "listing"

    def unavailable(self, options: RendererOptions) -> str | None:
        return None

    def create(self, options: RendererOptions) -> ListingRenderer:
        return ListingRenderer()


class ChartUser(BasePlugin[NoConfig]):
    """Renders one chart through the helm plugin's service once it runs, and contributes a renderer."""

    chart: ClassVar[str] = ""
    spec: ClassVar[PluginSpec] = PluginSpec(name="chart_user", description="Renders a chart.", after=("helm",))

    def setup(self, ctx: SetupContext) -> None:
        ctx.extend(HELM_RENDERERS, ListingProvider())

    async def run(self, ctx: RunContext[NoConfig], *, task_status: TaskStatus[None]) -> None:
        RESULTS.append(await ctx.services.get(CHART_RENDERER).render(RenderRequest(chart=self.chart, release="p")))
        task_status.started()
        await ctx.wait_stopping()


def _config(tmp_path: Path, nats: NatsServer, **settings: str):  # type: ignore[no-untyped-def]
    return config_for_test(
        tmp_path / "state",
        nats_url=nats.url,
        extra_plugins=["tests.integration.test_helm_plugin:ChartUser"],
        settings={"role": "custom", "plugins.helm.enabled": "true", "plugins.chart_user.enabled": "true", **settings},
    )


async def test_plugins_render_through_the_configured_renderer(tmp_path: Path, nats_server: NatsServer) -> None:
    RESULTS.clear()
    ChartUser.chart = str(write_chart(tmp_path))
    async with running_host(_config(tmp_path, nats_server, **{"plugins.helm.renderer": "sdk"})):
        pass
    assert [(r.renderer, r.chart_name) for r in RESULTS] == [("sdk", "demo")]
    assert [o["kind"] for o in RESULTS[0].objects] == ["ServiceAccount", "ConfigMap", "Deployment"]

    RESULTS.clear()
    async with running_host(_config(tmp_path, nats_server, **{"plugins.helm.renderer": "listing"})):
        pass
    assert RESULTS[0].renderer == "listing"
    assert "Chart.yaml" in RESULTS[0].objects[0]["files"]


async def test_a_renderer_that_cannot_run_stops_the_host_with_the_reason(
    tmp_path: Path, nats_server: NatsServer
) -> None:
    config = _config(
        tmp_path,
        nats_server,
        **{"plugins.helm.renderer": "binary", "plugins.helm.binary": str(tmp_path / "no-helm")},
    )
    with (
        anyio.fail_after(20),
        pytest.raises(HostFailed, match=r"plugins.helm.renderer: the binary Helm renderer cannot run here: .*no-helm"),
    ):
        await Host(config).serve()


async def test_the_service_says_why_it_cannot_render() -> None:
    service = ChartRenderer()
    with pytest.raises(HelmRenderError, match="the helm plugin has not started yet"):
        await service.render(RenderRequest(chart="x"))
    service.configure(None, "no Helm renderer can run here (...)")
    with pytest.raises(HelmRenderError, match=r"cannot render Helm charts: no Helm renderer can run here"):
        await service.render(RenderRequest(chart="x"))
