"""Steps both built-in renderers share: checking the request, the deadline, and the result."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import anyio

from nvcf_mono.helm.errors import HelmRenderError
from nvcf_mono.helm.manifests import crds_skipped, objects_and_skipped
from nvcf_mono.helm.model import RenderedChart
from nvcf_mono.helm.source import ChartSource


@contextmanager
def deadline(source: ChartSource, timeout: float) -> Iterator[None]:
    """Fetching and rendering ``source`` must finish within ``timeout`` seconds."""
    try:
        with anyio.fail_after(timeout):
            yield
    except TimeoutError:
        raise HelmRenderError(f"rendering chart {source.display} did not finish within {timeout:g}s") from None


def rendered_chart(
    *,
    metadata: dict[str, Any],
    templates: Iterable[tuple[str, str]],
    crds: Iterable[tuple[str, str]],
    renderer: str,
) -> RenderedChart:
    """The result from the chart's metadata, its rendered templates and its ``crds/`` files."""
    objects, skipped = objects_and_skipped(templates)
    return RenderedChart(
        chart_name=str(metadata.get("name") or ""),
        chart_version=str(metadata.get("version") or ""),
        objects=objects,
        skipped=(*crds_skipped(crds), *skipped),
        renderer=renderer,
    )
