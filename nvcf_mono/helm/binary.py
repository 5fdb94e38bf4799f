"""The renderer that runs the ``helm`` executable: ``helm template`` in a subprocess, under a deadline.

Hooks are rendered (no ``--no-hooks``) so that they can be reported as skipped; like every hook, they
are left out of the result. Remote charts (https, OCI) are fetched first by this process, so each is
downloaded once, through the platform's checked client, and read locally by ``helm show`` and ``helm template``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path

import anyio
import yaml

from nvcf_mono.helm.common import deadline, rendered_chart
from nvcf_mono.helm.download import fetch_chart
from nvcf_mono.helm.errors import HelmRenderError
from nvcf_mono.helm.model import RenderedChart, RendererOptions, RenderRequest
from nvcf_mono.helm.source import ChartSource, chart_source

NAME = "binary"


def find_helm(options: RendererOptions) -> str | None:
    """The helm executable to run: ``options.binary`` (a path or a name on PATH), else ``helm`` on PATH."""
    search = None if options.environ is None else options.environ.get("PATH", "")
    wanted = options.binary
    if wanted is not None and wanted.parent != Path():
        return str(wanted) if wanted.is_file() and os.access(wanted, os.X_OK) else None
    return shutil.which(str(wanted or "helm"), path=search)


class BinaryProvider:
    """Makes :class:`BinaryRenderer` where a helm executable is found."""

    name = NAME

    def unavailable(self, options: RendererOptions) -> str | None:
        if find_helm(options) is not None:
            return None
        if options.binary is not None:
            return f"{options.binary} is not an executable"
        return "the helm executable is not on PATH"

    def create(self, options: RendererOptions) -> BinaryRenderer:
        binary = find_helm(options)
        if binary is None:
            raise HelmRenderError(f"the {NAME} Helm renderer cannot run here: {self.unavailable(options)}")
        return BinaryRenderer(binary, options)


class BinaryRenderer:
    """Renders with ``helm template``."""

    name = NAME

    def __init__(self, binary: str, options: RendererOptions) -> None:
        self.binary = binary
        self.options = options

    async def render(self, request: RenderRequest) -> RenderedChart:
        request.check()
        source = chart_source(request.chart)
        with deadline(source, self.options.timeout):
            async with anyio.TemporaryDirectory(prefix="nvcf-helm-") as tmp:
                work = Path(tmp)
                chart = await self._local_chart(source, request, work)
                metadata = yaml.safe_load(await self._helm("read chart", source, "show", "chart", chart))
                crds = await self._helm("list the CRDs of chart", source, "show", "crds", chart)
                values = work / "values.yaml"
                await anyio.Path(values).write_text(_values_yaml(request))
                output = await self._helm(
                    "render chart",
                    source,
                    "template",
                    request.release,
                    chart,
                    "--namespace",
                    request.namespace,
                    "--values",
                    str(values),
                    "--skip-crds",
                )
        return rendered_chart(
            metadata=metadata if isinstance(metadata, dict) else {},
            templates=[("helm template", output)],
            crds=[("crds/", crds)],
            renderer=NAME,
        )

    async def _local_chart(self, source: ChartSource, request: RenderRequest, work: Path) -> str:
        """A local path of the chart: as given, or fetched (https, OCI) into ``work``."""
        if source.kind in ("https", "oci"):
            data = await fetch_chart(source, source.credentials(request.credentials), self.options)
            archive = anyio.Path(work / "chart.tgz")
            await archive.write_bytes(data)
            return str(archive)
        return str(source.path)

    async def _helm(self, what: str, source: ChartSource, *args: str) -> str:
        env: Mapping[str, str] | None = self.options.environ
        try:
            result = await anyio.run_process([self.binary, *args], check=False, env=env)
        except OSError as err:
            raise HelmRenderError(f"cannot run {self.binary}: {err.strerror or err}") from err
        if result.returncode != 0:
            raise HelmRenderError(f"cannot {what} {source.display}: {_helm_error(result.stderr, result.returncode)}")
        return result.stdout.decode(errors="replace")


def _values_yaml(request: RenderRequest) -> str:
    try:
        return yaml.safe_dump(dict(request.values), sort_keys=False)
    except yaml.YAMLError as err:
        raise HelmRenderError(f"values cannot be passed to Helm: {err}") from err


def _helm_error(stderr: bytes, returncode: int) -> str:
    """Helm's own message from its ``Error:`` line on (warnings before it are dropped), without the prefix."""
    lines = [line.rstrip() for line in stderr.decode(errors="replace").splitlines() if line.strip()]
    first = next((i for i, line in enumerate(lines) if line.startswith("Error: ")), 0)
    text = "\n".join(lines[first:]).removeprefix("Error: ")
    return text or f"helm exited with status {returncode}"
