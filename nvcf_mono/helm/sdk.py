"""The in-process renderer: Helm's Go SDK through helm-python-sdk (``pip install 'nvcf-mono[helm]'``).

Its calls block (ctypes into the Go library), so they run in worker threads. A thread cannot be
interrupted: past the deadline the render is abandoned, and its thread finishes in the background.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import anyio.to_thread

from nvcf_mono.helm.common import deadline, rendered_chart
from nvcf_mono.helm.download import fetch_chart
from nvcf_mono.helm.errors import HelmRenderError
from nvcf_mono.helm.model import RenderedChart, RendererOptions, RenderRequest
from nvcf_mono.helm.source import ChartSource, chart_source

if TYPE_CHECKING:
    import helm_python

NAME = "sdk"
NOT_INSTALLED = "the helm-python-sdk package is not installed (pip install 'nvcf-mono[helm]')"

T = TypeVar("T")


class SdkProvider:
    """Makes :class:`SdkRenderer` where helm-python-sdk is installed."""

    name = NAME

    def unavailable(self, options: RendererOptions) -> str | None:
        return None if importlib.util.find_spec("helm_python") is not None else NOT_INSTALLED

    def create(self, options: RendererOptions) -> SdkRenderer:
        return SdkRenderer(options)


class SdkRenderer:
    """Renders in this process with helm-python-sdk."""

    name = NAME

    def __init__(self, options: RendererOptions) -> None:
        self.options = options

    async def render(self, request: RenderRequest) -> RenderedChart:
        request.check()
        source = chart_source(request.chart)
        values = _plain(request.values)
        with deadline(source, self.options.timeout):
            if source.kind in ("https", "oci"):
                data = await fetch_chart(source, source.credentials(request.credentials), self.options)
                return await _in_thread(partial(_render, partial(_load_bytes, data), source, values, request))
            return await _in_thread(partial(_render, partial(_load_path, source.path), source, values, request))


async def _in_thread(call: Callable[[], T]) -> T:
    return await anyio.to_thread.run_sync(call, abandon_on_cancel=True)


def _plain(values: Mapping[str, Any]) -> dict[str, Any]:
    """Values as JSON (the SDK's input); YAML timestamps become text, as Helm's own values parsing leaves them."""
    try:
        plain: dict[str, Any] = json.loads(json.dumps(values, default=str))
    except (TypeError, ValueError) as err:
        raise HelmRenderError(f"values cannot be passed to Helm: {err}") from err
    return plain


def _load_path(path: Path) -> helm_python.Chart:
    import helm_python

    return helm_python.Chart.load(path)


def _load_bytes(data: bytes) -> helm_python.Chart:
    import helm_python

    return helm_python.Chart.load_archive(data)


def _render(
    load: Callable[[], helm_python.Chart], source: ChartSource, values: dict[str, Any], request: RenderRequest
) -> RenderedChart:
    import helm_python

    shown = source.display
    try:
        chart = load()
    except helm_python.HelmError as err:
        raise HelmRenderError(f"cannot load chart {shown}: {err.detail}") from err
    try:
        with chart:
            metadata = chart.metadata
            _check_installable(shown, metadata, chart.dependencies)
            manifests = chart.render(values, name=request.release, namespace=request.namespace, is_install=True)
            crds = [(crd["filename"], crd["data"]) for crd in chart.crds]
    except helm_python.HelmError as err:
        raise HelmRenderError(f"cannot render chart {shown}: {err.detail}") from err
    return rendered_chart(
        metadata=metadata,
        templates=[(path, text) for path, text in sorted(manifests.items()) if _is_manifest(path)],
        crds=crds,
        renderer=NAME,
    )


def _is_manifest(path: str) -> bool:
    """What ``helm template`` prints: not the release notes, not partials (``_helpers.tpl``)."""
    base = path.rsplit("/", 1)[-1]
    return not (base.startswith("_") or path.endswith("NOTES.txt"))


def _check_installable(shown: str, metadata: dict[str, Any], loaded: list[dict[str, Any]]) -> None:
    """What ``helm template`` refuses and the SDK's render does not check."""
    if metadata.get("type") == "library":
        raise HelmRenderError(
            f"cannot render chart {shown}: it is a library chart, and library charts are not installable"
        )
    declared = {str(dep.get("name")) for dep in metadata.get("dependencies") or () if isinstance(dep, dict)}
    missing = sorted(declared - {str(dep.get("name")) for dep in loaded})
    if missing:
        raise HelmRenderError(
            f"cannot render chart {shown}: dependencies {', '.join(missing)} are declared in Chart.yaml but missing "
            "from charts/ (run `helm dependency build` first)"
        )
