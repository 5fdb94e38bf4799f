"""Rendering Helm charts into Kubernetes objects, for the control plane (validation) and compute agents.

    result = await render_chart(RenderRequest(chart="oci://registry.example.com/charts/app:1.0",
                                              values={"replicas": 2}, release="app", namespace="fn-1"))
    result.objects   # dicts, in Helm's install order; hooks and CRDs are never among them
    result.skipped   # what was left out, and why

A chart is a directory, a ``.tgz``, an ``oci://`` reference or an ``https://`` URL; remote charts are
fetched by this process (:mod:`nvcf_mono.helm.download`, :mod:`nvcf_mono.helm.oci`). Two renderers ship:
``binary`` (the ``helm`` executable) and ``sdk`` (helm-python-sdk, in process); ``auto`` takes the
binary when it is on PATH. Plugins add others through :data:`HELM_RENDERERS`; inside the platform,
the ``helm`` plugin provides the configured one as :data:`CHART_RENDERER`.
"""

from nvcf_mono.helm.errors import HelmRenderError
from nvcf_mono.helm.model import RegistryCredential, RenderedChart, RendererOptions, RenderRequest, SkippedObject
from nvcf_mono.helm.renderers import (
    AUTO,
    HELM_RENDERERS,
    Renderer,
    RendererProvider,
    builtin_providers,
    render_chart,
    select_renderer,
)
from nvcf_mono.helm.service import CHART_RENDERER, ChartRenderer

__all__ = [
    "AUTO",
    "CHART_RENDERER",
    "HELM_RENDERERS",
    "ChartRenderer",
    "HelmRenderError",
    "RegistryCredential",
    "RenderRequest",
    "RenderedChart",
    "Renderer",
    "RendererOptions",
    "RendererProvider",
    "SkippedObject",
    "builtin_providers",
    "render_chart",
    "select_renderer",
]
