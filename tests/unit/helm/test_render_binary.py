"""The binary renderer: how it runs ``helm`` and reads its answers.

No helm executable is installed here or in CI, so these tests put ``fake_helm.py`` first on PATH: a
stand-in that implements the few helm commands the renderer uses, in helm's output and error formats,
rendering with the Go SDK. They check the renderer's side (arguments, values file,
output parsing, errors, deadline), not helm itself.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from nvcf_mono.helm import (
    HelmRenderError,
    RenderedChart,
    RendererOptions,
    RenderRequest,
    builtin_providers,
    render_chart,
    select_renderer,
)
from tests.unit.helm.charts import BROKEN_TEMPLATES, write_chart

FAKE = Path(__file__).with_name("fake_helm.py")


def _executable(path: Path, script: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(script)
    path.chmod(0o755)
    return path


@pytest.fixture
def helm_env(tmp_path: Path) -> dict[str, str]:
    """An environment whose PATH holds only the stand-in ``helm``."""
    bin_dir = tmp_path / "bin"
    _executable(bin_dir / "helm", f'#!/bin/sh\nexec "{sys.executable}" "{FAKE}" "$@"\n')
    return {"PATH": str(bin_dir), "FAKE_HELM_LOG": str(tmp_path / "helm.log"), "HOME": str(tmp_path)}


def _calls(env: dict[str, str]) -> list[list[str]]:
    return [json.loads(line) for line in Path(env["FAKE_HELM_LOG"]).read_text().splitlines()]


def _helm_ran(env: dict[str, str]) -> bool:
    return Path(env["FAKE_HELM_LOG"]).exists()


async def _render(chart: Path | str, env: dict[str, str], **kwargs: object) -> RenderedChart:
    request = RenderRequest(chart=str(chart), **kwargs)  # type: ignore[arg-type]
    return await render_chart(request, renderer="binary", options=RendererOptions(environ=env))


async def test_auto_takes_the_binary_when_it_is_on_path_and_the_sdk_otherwise(
    tmp_path: Path, helm_env: dict[str, str]
) -> None:
    assert select_renderer("auto", builtin_providers(), RendererOptions(environ=helm_env)).name == "binary"
    no_helm = {"PATH": str(tmp_path / "empty")}
    assert select_renderer("auto", builtin_providers(), RendererOptions(environ=no_helm)).name == "sdk"
    explicit = RendererOptions(binary=Path(helm_env["PATH"]) / "helm", environ=no_helm)
    assert select_renderer("auto", builtin_providers(), explicit).name == "binary"


async def test_the_binary_renders_what_the_sdk_renders(tmp_path: Path, helm_env: dict[str, str]) -> None:
    chart = write_chart(tmp_path)
    request = {"values": {"greeting": "same", "replicas": 2}, "release": "twin", "namespace": "ns-b"}
    by_binary = await _render(chart, helm_env, **request)
    by_sdk = await render_chart(RenderRequest(chart=str(chart), **request), renderer="sdk")  # type: ignore[arg-type]
    assert by_binary.renderer == "binary"
    assert (by_binary.chart_name, by_binary.chart_version) == ("demo", "1.2.3")
    assert by_binary.objects == by_sdk.objects
    # helm show crds names no files: the CRDs of crds/ are known by kind and name.
    assert sorted(str((s.kind, s.name, s.reason)) for s in by_binary.skipped) == sorted(
        str((s.kind, s.name, s.reason)) for s in by_sdk.skipped
    )
    hook = next(s for s in by_binary.skipped if s.name == "twin-migrate")
    assert hook.source == "demo/templates/hooks.yaml"


async def test_helm_is_called_with_the_release_namespace_values_file_and_no_crds(
    tmp_path: Path, helm_env: dict[str, str]
) -> None:
    chart = write_chart(tmp_path)
    await _render(chart, helm_env, values={"greeting": "hi"}, release="rel", namespace="ns")
    calls = _calls(helm_env)
    assert [call[:2] for call in calls] == [["show", "chart"], ["show", "crds"], ["template", "rel"]]
    template = calls[2]
    assert template[2] == str(chart)
    assert template[template.index("--namespace") + 1] == "ns"
    assert "--skip-crds" in template
    assert "--no-hooks" not in template  # hooks are rendered so that they can be reported as skipped
    assert template[template.index("--values") + 1].endswith("values.yaml")


async def test_a_template_error_carries_helms_message(tmp_path: Path, helm_env: dict[str, str]) -> None:
    chart = write_chart(tmp_path, "broken", templates=BROKEN_TEMPLATES, crds={})
    with pytest.raises(HelmRenderError) as caught:
        await _render(chart, helm_env)
    message = str(caught.value)
    assert message.startswith(f"cannot render chart {chart}: execution error at (broken/templates/configmap.yaml")
    assert message.endswith("set .Values.name: the ConfigMap needs a name")


async def test_a_missing_chart_is_reported_before_helm_runs(tmp_path: Path, helm_env: dict[str, str]) -> None:
    with pytest.raises(HelmRenderError, match=r"chart not found: .*/nowhere does not exist"):
        await _render(tmp_path / "nowhere", helm_env)
    assert not _helm_ran(helm_env)


async def test_a_helm_that_hangs_is_stopped_at_the_deadline(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    _executable(bin_dir / "helm", "#!/bin/sh\nexec sleep 30\n")
    options = RendererOptions(environ={"PATH": f"{bin_dir}:/usr/bin:/bin"}, timeout=0.5)
    with pytest.raises(HelmRenderError, match=r"rendering chart .* did not finish within 0.5s"):
        await render_chart(RenderRequest(chart=str(write_chart(tmp_path))), renderer="binary", options=options)


async def test_a_binary_that_is_not_there_is_named(tmp_path: Path) -> None:
    options = RendererOptions(binary=tmp_path / "no-helm", environ={"PATH": ""})
    with pytest.raises(
        HelmRenderError, match=r"the binary Helm renderer cannot run here: .*/no-helm is not an executable"
    ):
        select_renderer("binary", builtin_providers(), options)
    with pytest.raises(HelmRenderError, match=r"the helm executable is not on PATH"):
        select_renderer("binary", builtin_providers(), RendererOptions(environ={"PATH": ""}))
