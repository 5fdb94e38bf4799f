"""Renderers and how one is chosen: ``auto`` (the helm binary when present, else helm-python-sdk) or by name.

A plugin may add a renderer: contribute a :class:`RendererProvider` to :data:`HELM_RENDERERS` in its
``setup()`` and name it in ``plugins.helm.renderer``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol

from nvcf_mono.helm.errors import HelmRenderError
from nvcf_mono.helm.model import RenderedChart, RendererOptions, RenderRequest
from nvcf_mono.services import ExtensionPoint

AUTO = "auto"
#: What ``auto`` tries, in order.
AUTO_ORDER = ("binary", "sdk")


class Renderer(Protocol):
    """Renders charts; raises :class:`HelmRenderError` with a message for the user."""

    name: str

    async def render(self, request: RenderRequest) -> RenderedChart: ...


class RendererProvider(Protocol):
    """Makes one kind of renderer, and tells whether it can run on this machine."""

    name: str

    def unavailable(self, options: RendererOptions) -> str | None:
        """Why this renderer cannot run here (what to install), or ``None`` when it can."""
        ...

    def create(self, options: RendererOptions) -> Renderer: ...


#: Renderers plugins contribute (the ``helm`` plugin contributes ``binary`` and ``sdk``).
HELM_RENDERERS: ExtensionPoint[RendererProvider] = ExtensionPoint("nvcf_mono.helm.renderers")


def builtin_providers() -> tuple[RendererProvider, ...]:
    """The helm binary and helm-python-sdk."""
    from nvcf_mono.helm.binary import BinaryProvider
    from nvcf_mono.helm.sdk import SdkProvider

    return (BinaryProvider(), SdkProvider())


def select_renderer(
    choice: str, providers: Iterable[RendererProvider], options: RendererOptions | None = None
) -> Renderer:
    """The renderer ``choice`` names (``auto``: the first of :data:`AUTO_ORDER` that can run here)."""
    options = options or RendererOptions()
    by_name: Mapping[str, RendererProvider] = {p.name: p for p in providers}
    if choice == AUTO:
        reasons = []
        for name in AUTO_ORDER:
            provider = by_name.get(name)
            if provider is None:
                continue
            why = provider.unavailable(options)
            if why is None:
                return provider.create(options)
            reasons.append(f"{name}: {why}")
        raise HelmRenderError(
            "no Helm renderer can run here ("
            + "; ".join(reasons or ["none is installed"])
            + "): install helm, or pip install 'nvcf-mono[helm]'"
        )
    provider = by_name.get(choice)
    if provider is None:
        known = ", ".join([AUTO, *sorted(by_name)])
        raise HelmRenderError(f"no Helm renderer named {choice!r} (available: {known})")
    why = provider.unavailable(options)
    if why is not None:
        raise HelmRenderError(f"the {choice} Helm renderer cannot run here: {why}")
    return provider.create(options)


async def render_chart(
    request: RenderRequest,
    *,
    renderer: str = AUTO,
    options: RendererOptions | None = None,
    providers: Iterable[RendererProvider] = (),
) -> RenderedChart:
    """Render one chart with the renderer ``renderer`` names, among the built-in ones and ``providers``."""
    chosen = select_renderer(renderer, [*builtin_providers(), *providers], options)
    return await chosen.render(request)
