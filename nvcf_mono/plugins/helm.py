"""Plugin ``helm``: renders Helm charts for the other plugins (``CHART_RENDERER``).

It contributes the built-in renderers (the ``helm`` executable and helm-python-sdk) to
``HELM_RENDERERS`` and, once every plugin is set up, picks the one ``plugins.helm.renderer`` names.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import attrs
from anyio.abc import TaskStatus

from nvcf_mono.contracts.egress import networks_problem, servers_problem
from nvcf_mono.helm import (
    AUTO,
    CHART_RENDERER,
    HELM_RENDERERS,
    ChartRenderer,
    HelmRenderError,
    RendererOptions,
    builtin_providers,
    select_renderer,
)
from nvcf_mono.plugin import BasePlugin, PluginConfigError, PluginSpec, RunContext, SetupContext
from nvcf_mono.structure import ByteSize, Seconds, in_range, matches, positive, setting


@attrs.frozen(kw_only=True)
class HelmConfig:
    """How Helm charts are fetched and rendered."""

    renderer: str = setting(
        AUTO,
        doc="auto (the helm executable when found, else helm-python-sdk), binary, sdk, or a renderer a plugin "
        "provides. With auto and neither installed, the platform runs and rendering fails with what to install.",
        check=matches(r"[a-z][a-z0-9_-]*", "a renderer name: auto, binary, sdk, ..."),
    )
    binary: Path | None = setting(None, doc="The helm executable (binary renderer). Default: helm on PATH.")
    timeout: Seconds = setting(60.0, doc="Deadline of one render, downloading the chart included.", check=positive)
    max_chart_size: ByteSize = setting(
        20 * 1024 * 1024,
        doc="Largest chart archive fetched from an https URL or an OCI registry.",
        check=in_range(1024, 1024 * 1024 * 1024),
    )
    ca_file: Path | None = setting(
        None, doc="A CA bundle trusted, besides the system's, for charts fetched over https (URLs and OCI registries)."
    )
    chart_networks: tuple[str, ...] = setting(
        (),
        doc="Non-public networks (CIDR) charts may be fetched from and images checked in, e.g. [10.20.0.0/16] for a "
        "registry in the cluster. A function's chart URL (and its images) is a tenant's and the platform fetches it, "
        "so its host is reached only at public addresses and in these networks (unspecified and multicast addresses "
        "never); names are checked as they resolve, redirects too.",
        check=networks_problem,
    )
    plain_http_registries: tuple[str, ...] = setting(
        (),
        doc="OCI registries (host or host:port) charts are pulled from, and their images checked in, over plain "
        "http, e.g. [registry.lab:5000] for one on the operator's network without TLS; their addresses must still "
        "be public or in chart_networks, and credentials go to them unencrypted.",
        check=servers_problem,
    )


class Helm(BasePlugin[HelmConfig]):
    """Plugin ``helm``."""

    spec: ClassVar[PluginSpec] = PluginSpec(
        name="helm",
        description="Renders Helm charts (the helm executable or helm-python-sdk) for the planes.",
        roles=frozenset({"all-in-one", "control", "compute"}),
        config_type=HelmConfig,
    )

    def setup(self, ctx: SetupContext) -> None:
        self.renderer = ChartRenderer()
        for provider in builtin_providers():
            ctx.extend(HELM_RENDERERS, provider)
        ctx.provide(CHART_RENDERER, self.renderer)

    async def run(self, ctx: RunContext[HelmConfig], *, task_status: TaskStatus[None]) -> None:
        config = self.config
        options = RendererOptions(
            binary=config.binary,
            timeout=config.timeout,
            max_chart_size=config.max_chart_size,
            ca_file=config.ca_file,
            chart_networks=config.chart_networks,
            plain_http=config.plain_http_registries,
        )
        providers = [ext.value for ext in ctx.services.extensions(HELM_RENDERERS)]
        try:
            chosen = select_renderer(config.renderer, providers, options)
        except HelmRenderError as err:
            if config.renderer != AUTO:
                raise PluginConfigError(f"plugins.helm.renderer: {err}") from err
            # Nothing uses Helm until a Helm function arrives: run, and let each render say what is missing.
            self.renderer.configure(None, str(err), options=options)
            ctx.log.warning("Helm charts cannot be rendered on this node: %s", err)
        else:
            self.renderer.configure(chosen, options=options)
            ctx.log.info("Helm charts are rendered by the %s renderer", chosen.name)
        task_status.started()
        await ctx.wait_stopping()
