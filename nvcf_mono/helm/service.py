"""The renderer the ``helm`` plugin chose, as a service other plugins render charts (and check their images)
through.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import final

from nvcf_mono.helm.errors import HelmRenderError
from nvcf_mono.helm.images import ImageChecker
from nvcf_mono.helm.model import RegistryCredential, RenderedChart, RendererOptions, RenderRequest
from nvcf_mono.helm.renderers import Renderer
from nvcf_mono.services import ServiceKey


@final
class ChartRenderer:
    """Provided during ``setup()``, configured when the ``helm`` plugin runs (start after it: ``after=("helm",)``)."""

    def __init__(self) -> None:
        self._renderer: Renderer | None = None
        self._why_not = "the helm plugin has not started yet"
        self._images = ImageChecker(RendererOptions(chart_networks=()))

    def configure(
        self, renderer: Renderer | None, why_not: str = "", *, options: RendererOptions | None = None
    ) -> None:
        """Use ``renderer``; ``None`` when none can run here, ``why_not`` saying why (and what to install).
        ``options``: how images are checked (their CA, networks, deadline).
        """
        self._renderer = renderer
        self._why_not = why_not
        if options is not None:
            self._images = ImageChecker(options)

    @property
    def name(self) -> str | None:
        """The renderer in use, or ``None``."""
        return None if self._renderer is None else self._renderer.name

    async def render(self, request: RenderRequest) -> RenderedChart:
        """Render with the configured renderer; :class:`HelmRenderError` when there is none."""
        if self._renderer is None:
            raise HelmRenderError(f"cannot render Helm charts: {self._why_not}")
        return await self._renderer.render(request)

    async def check(self, images: Iterable[str], secrets: Sequence[Mapping[str, RegistryCredential]]) -> list[str]:
        """What is wrong with a chart's ``images`` (:meth:`ImageChecker.check`)."""
        return await self._images.check(images, secrets)


#: Provided by the ``helm`` plugin.
CHART_RENDERER: ServiceKey[ChartRenderer] = ServiceKey("nvcf_mono.helm.renderer")
