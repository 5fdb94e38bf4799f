"""The renderer the ``helm`` plugin chose, as a service other plugins render charts through."""

from __future__ import annotations

from typing import final

from nvcf_mono.helm.errors import HelmRenderError
from nvcf_mono.helm.model import RenderedChart, RenderRequest
from nvcf_mono.helm.renderers import Renderer
from nvcf_mono.services import ServiceKey


@final
class ChartRenderer:
    """Provided during ``setup()``, configured when the ``helm`` plugin runs (start after it: ``after=("helm",)``)."""

    def __init__(self) -> None:
        self._renderer: Renderer | None = None
        self._why_not = "the helm plugin has not started yet"

    def configure(self, renderer: Renderer | None, why_not: str = "") -> None:
        """Use ``renderer``; ``None`` when none can run here, ``why_not`` saying why (and what to install)."""
        self._renderer = renderer
        self._why_not = why_not

    @property
    def name(self) -> str | None:
        """The renderer in use, or ``None``."""
        return None if self._renderer is None else self._renderer.name

    async def render(self, request: RenderRequest) -> RenderedChart:
        """Render with the configured renderer; :class:`HelmRenderError` when there is none."""
        if self._renderer is None:
            raise HelmRenderError(f"cannot render Helm charts: {self._why_not}")
        return await self._renderer.render(request)


#: Provided by the ``helm`` plugin.
CHART_RENDERER: ServiceKey[ChartRenderer] = ServiceKey("nvcf_mono.helm.renderer")
