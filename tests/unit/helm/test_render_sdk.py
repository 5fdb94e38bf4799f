"""The in-process renderer (helm-python-sdk), for real, on charts the tests write."""

from __future__ import annotations

from pathlib import Path

import pytest

from nvcf_mono.helm import HelmRenderError, RenderedChart, RenderRequest, render_chart
from tests.unit.helm.charts import BROKEN_TEMPLATES, package, write_chart


async def _render(chart: Path | str, **kwargs: object) -> RenderedChart:
    return await render_chart(RenderRequest(chart=str(chart), **kwargs), renderer="sdk")  # type: ignore[arg-type]


def _names(result: RenderedChart) -> list[tuple[str, str]]:
    return [(obj["kind"], obj["metadata"]["name"]) for obj in result.objects]


async def test_values_release_and_namespace_reach_the_objects(tmp_path: Path) -> None:
    chart = write_chart(tmp_path)
    result = await _render(chart, values={"greeting": "hi there", "replicas": 3}, release="fn-1", namespace="ns-a")
    assert (result.chart_name, result.chart_version, result.renderer) == ("demo", "1.2.3", "sdk")
    # Helm's install order: the service account before the config map before the deployment.
    assert _names(result) == [
        ("ServiceAccount", "fn-1"),
        ("ConfigMap", "fn-1-settings"),
        ("Deployment", "fn-1-server"),
    ]
    config_map, deployment = result.objects[1], result.objects[2]
    assert config_map["data"] == {"greeting": "hi there"}
    assert config_map["metadata"]["namespace"] == "ns-a"
    assert config_map["metadata"]["labels"] == {"app": "demo"}  # a partial from _helpers.tpl
    assert deployment["spec"]["replicas"] == 3
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.example.com/demo:1"


async def test_hooks_crds_and_non_objects_are_skipped_and_listed(tmp_path: Path) -> None:
    result = await _render(write_chart(tmp_path), release="r")
    kinds = {obj["kind"] for obj in result.objects}
    assert not kinds & {"Job", "Pod", "CustomResourceDefinition"}
    skipped = {(s.kind, s.name): s for s in result.skipped}
    assert set(skipped) == {
        ("Job", "r-migrate"),
        ("Pod", "r-test"),
        ("CustomResourceDefinition", "widgets.example.com"),
        ("CustomResourceDefinition", "gadgets.example.com"),
        (None, None),
    }
    assert "Helm hook (pre-install,pre-upgrade)" in skipped["Job", "r-migrate"].reason
    assert "Helm hook (test)" in skipped["Pod", "r-test"].reason
    assert skipped["Job", "r-migrate"].source == "demo/templates/hooks.yaml"
    assert "crds/ directory" in skipped["CustomResourceDefinition", "gadgets.example.com"].reason
    assert skipped["CustomResourceDefinition", "gadgets.example.com"].source == "demo/crds/gadgets.yaml"
    assert "no apiVersion or kind" in skipped[None, None].reason
    assert str(skipped["Job", "r-migrate"]).startswith("Job/r-migrate (demo/templates/hooks.yaml): a Helm hook")


async def test_a_tgz_archive_renders_like_its_directory(tmp_path: Path) -> None:
    chart = write_chart(tmp_path / "src")
    archive = package(chart, tmp_path / "dist")
    from_dir = await _render(chart, release="r", namespace="n")
    from_archive = await _render(archive, release="r", namespace="n")
    assert from_archive.objects == from_dir.objects
    assert from_archive.skipped == from_dir.skipped
    assert (from_archive.chart_name, from_archive.chart_version) == ("demo", "1.2.3")


async def test_a_template_error_says_which_template_and_why(tmp_path: Path) -> None:
    chart = write_chart(tmp_path, "broken", templates=BROKEN_TEMPLATES, crds={})
    with pytest.raises(HelmRenderError) as caught:
        await _render(chart)
    message = str(caught.value)
    assert message.startswith(f"cannot render chart {chart}: ")
    assert "broken/templates/configmap.yaml" in message
    assert "set .Values.name: the ConfigMap needs a name" in message
    result = await _render(chart, values={"name": "given"})  # the same chart renders once the value is set
    assert _names(result) == [("ConfigMap", "given")]


async def test_values_that_break_the_chart_schema_are_refused(tmp_path: Path) -> None:
    chart = write_chart(tmp_path)
    (chart / "values.schema.json").write_text('{"type": "object", "properties": {"replicas": {"type": "integer"}}}')
    with pytest.raises(HelmRenderError, match=r"(?s)cannot render chart .*replicas.*want integer"):
        await _render(chart, values={"replicas": "three"})


async def test_invalid_yaml_from_a_template_is_an_error(tmp_path: Path) -> None:
    chart = write_chart(tmp_path, templates={"bad.yaml": "items: [\n"}, crds={})
    with pytest.raises(HelmRenderError, match=r"demo/templates/bad.yaml renders invalid YAML"):
        await _render(chart)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda tmp: tmp / "missing", r"chart not found: .*/missing does not exist"),
        (lambda tmp: tmp, r"is not a chart: the directory has no Chart.yaml"),
        (lambda tmp: _write(tmp / "junk.tgz", b"not an archive"), r"cannot load chart .*/junk.tgz: "),
        (lambda tmp: "", r"no chart given"),
        (lambda tmp: "http://charts.example.com/demo.tgz", r"unsupported chart reference .*https://"),
        (lambda tmp: "ftp://charts.example.com/demo.tgz", r"unsupported chart reference"),
    ],
    ids=["missing", "not-a-chart", "not-an-archive", "empty", "plain-http", "ftp"],
)
async def test_a_chart_that_is_not_there_gets_a_clear_error(tmp_path: Path, make, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(HelmRenderError, match=message):
        await _render(make(tmp_path))


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


async def test_library_charts_and_missing_dependencies_are_refused(tmp_path: Path) -> None:
    library = write_chart(tmp_path / "lib", "lib", templates={}, crds={})
    (library / "Chart.yaml").write_text("apiVersion: v2\nname: lib\nversion: 0.1.0\ntype: library\n")
    with pytest.raises(HelmRenderError, match="library charts are not installable"):
        await _render(library)
    app = write_chart(tmp_path / "app", "app", crds={})
    (app / "Chart.yaml").write_text(
        "apiVersion: v2\nname: app\nversion: 0.1.0\ndependencies:\n  - {name: redis, version: 1.0.0}\n"
    )
    with pytest.raises(HelmRenderError, match=r"dependencies redis are declared in Chart.yaml but missing"):
        await _render(app)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"release": "Not_Valid"}, "invalid release name 'Not_Valid'"),
        ({"release": "r" * 54}, "invalid release name"),
        ({"namespace": "a.b"}, "invalid namespace 'a.b'"),
    ],
)
async def test_bad_release_names_and_namespaces_are_refused(
    tmp_path: Path, kwargs: dict[str, str], message: str
) -> None:
    with pytest.raises(HelmRenderError, match=message):
        await _render(write_chart(tmp_path), **kwargs)


async def test_an_unreachable_oci_registry_is_a_clear_error() -> None:
    # Nothing listens on port 1: the pull fails at once, and the message says which chart and why.
    with pytest.raises(HelmRenderError, match=r"cannot pull chart oci://127\.0\.0\.1:1/charts/demo:1\.0\.0: .*refused"):
        await _render("oci://127.0.0.1:1/charts/demo:1.0.0")
