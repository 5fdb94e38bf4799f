"""``nvcf-mono helm render``: objects on stdout, what was skipped on stderr, clear errors."""

from __future__ import annotations

import io
import json
from pathlib import Path

import anyio
import yaml

from nvcf_mono.cli import main
from nvcf_mono.cli.context import CliContext
from tests.unit.helm.charts import BROKEN_TEMPLATES, package, write_chart
from tests.unit.helm.oci_registry import PASSWORD, USER, Registry, running


def _unused_host(*_: object) -> int:
    raise AssertionError("helm render starts no host")


def _cli(*argv: str, environ: dict[str, str] | None = None, stdin: bytes | None = None) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    ctx = CliContext(
        environ=environ or {"PATH": ""},
        stdout=out,
        stderr=err,
        run_host=_unused_host,
        stdin=io.BytesIO(stdin) if stdin is not None else None,
    )
    code = main(list(argv), ctx)
    return code, out.getvalue(), err.getvalue()


def test_render_prints_yaml_documents_and_reports_skipped_objects(tmp_path: Path) -> None:
    chart = write_chart(tmp_path / "src")
    first = tmp_path / "a.yaml"
    first.write_text("greeting: from-a\nreplicas: 2\nnested: {keep: 1, change: 1}\n")
    second = tmp_path / "b.yaml"
    second.write_text("greeting: from-b\nnested: {change: 2}\n")
    code, out, err = _cli(
        "helm", "render", str(chart), "-f", str(first), "--values", "-",  # the second from standard input
        "--set", "replicas=5", "--set", "image=registry.example.com/other:2",
        "--release", "cli", "--namespace", "tools",
        stdin=second.read_bytes(),
    )  # fmt: skip
    assert code == 0, err
    objects = list(yaml.safe_load_all(out))
    assert [(o["kind"], o["metadata"]["name"]) for o in objects] == [
        ("ServiceAccount", "cli"),
        ("ConfigMap", "cli-settings"),
        ("Deployment", "cli-server"),
    ]
    assert objects[1]["data"] == {"greeting": "from-b"}
    assert objects[1]["metadata"]["namespace"] == "tools"
    assert objects[2]["spec"]["replicas"] == 5
    assert objects[2]["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.example.com/other:2"
    lines = err.splitlines()
    assert "skipped Job/cli-migrate (demo/templates/hooks.yaml): a Helm hook (pre-install,pre-upgrade): " \
        "hooks are never installed" in lines  # fmt: skip
    assert any(line.startswith("skipped CustomResourceDefinition/gadgets.example.com") for line in lines)
    assert lines[-1] == "chart demo 1.2.3 (sdk renderer): 3 objects, 5 skipped"


def test_render_json_from_an_archive(tmp_path: Path) -> None:
    archive = package(write_chart(tmp_path / "src"), tmp_path / "dist")
    code, out, err = _cli("helm", "render", str(archive), "--json", "--renderer", "sdk", "--set", "greeting=true")
    assert code == 0, err
    data = json.loads(out)
    assert data["chart"] == {"name": "demo", "version": "1.2.3"}
    assert data["renderer"] == "sdk"
    assert [o["kind"] for o in data["objects"]] == ["ServiceAccount", "ConfigMap", "Deployment"]
    assert data["objects"][1]["data"] == {"greeting": "true"}  # a typed --set value, quoted by the template
    assert {"source", "kind", "name", "reason"} == set(data["skipped"][0])


def test_errors_are_one_clear_line_and_a_nonzero_exit(tmp_path: Path) -> None:
    broken = write_chart(tmp_path / "b", "broken", templates=BROKEN_TEMPLATES, crds={})
    code, out, err = _cli("helm", "render", str(broken))
    assert (code, out) == (1, "")
    assert err.startswith(f"nvcf-mono: cannot render chart {broken}: execution error at (broken/templates/")
    code, _, err = _cli("helm", "render", str(tmp_path / "missing"))
    assert code == 1 and f"nvcf-mono: chart not found: {tmp_path / 'missing'} does not exist" in err
    code, _, err = _cli("helm", "render", str(broken), "--renderer", "binary")
    assert (code, err) == (
        1,
        "nvcf-mono: the binary Helm renderer cannot run here: the helm executable is not on PATH\n",
    )
    code, _, err = _cli("helm", "render", str(broken), "-f", str(tmp_path / "nope.yaml"))
    assert (code, err) == (2, f"nvcf-mono: -f {tmp_path / 'nope.yaml'}: No such file or directory\n")
    code, _, err = _cli("helm", "render", str(broken), "-f", "-", "-f", "-", stdin=b"a: 1\n")
    assert (code, err) == (2, "nvcf-mono: -f -: standard input can be read once\n")
    listed = tmp_path / "list.yaml"
    listed.write_text("- a\n- b\n")
    code, _, err = _cli("helm", "render", str(broken), "-f", str(listed))
    assert code == 2 and f"values file {listed} must hold a mapping, not a list" in err
    code, _, err = _cli("helm", "render", str(broken), "--set", "noequals")
    assert code == 2 and "--set 'noequals': expected KEY=VALUE" in err
    code, _, err = _cli("helm", "render", str(broken), "--username", "me")
    assert code == 2 and "--username and --password-file go together" in err
    oci = ["helm", "render", "oci://127.0.0.1:9/charts/demo:1", "--username", "me", "--password-file", "-"]
    code, _, err = _cli(*oci)
    assert (code, err) == (2, "nvcf-mono: --password-file -: there is no standard input to read\n")
    code, _, err = _cli(*oci, "--timeout", "5", stdin=b"s3cret\n")
    assert code == 1 and "standard input" not in err  # the password was read; the registry is not there


async def test_a_plain_http_registry_is_named_on_the_command_line(tmp_path: Path) -> None:
    """``--plain-http-registry`` does for the operator's own renders and validations what the helm plugin's
    ``plain_http_registries`` does for the platform's; without it such a registry is refused, naming the flag.
    """
    registry = Registry(public={"acme/charts/demo"})
    registry.push("acme/charts/demo", "1.2.3", package(write_chart(tmp_path / "src"), tmp_path / "dist").read_bytes())
    password = tmp_path / "password"
    password.write_text(PASSWORD + "\n")
    async with running(registry, None):  # plain http: the registry, its token service, its blob storage
        host, storage = registry.base.partition("://")[2], registry.storage.partition("://")[2]
        chart = f"oci://{host}/acme/charts/demo-1.2.3.tgz"
        login = ("--username", USER, "--password-file", str(password), "--renderer", "sdk")

        async def cli(*argv: str) -> tuple[int, str, str]:
            return await anyio.to_thread.run_sync(lambda: _cli(*argv))

        code, out, err = await cli("helm", "render", chart, *login)
        assert (code, out) == (1, ""), err
        assert "reached over https only (unless plugins.helm.plain_http_registries or --plain-http-registry" in err
        listed = ("--plain-http-registry", host, "--plain-http-registry", storage)
        code, out, err = await cli("helm", "render", chart, *login, *listed, "--json")
        assert code == 0, err
        assert json.loads(out)["chart"] == {"name": "demo", "version": "1.2.3"}
        # validate: the images a chart names are checked in the registry the same way.
        image = ("--set", f"image={host}/acme/charts/demo:1.2.3", "--validate-images", "--renderer", "sdk")
        local = str(tmp_path / "src" / "demo")
        code, out, err = await cli("helm", "validate", local, *image, "--json")
        assert any("https only (unless" in e for e in json.loads(out)["validationErrors"]), out
        registry.requests.clear()
        code, out, err = await cli("helm", "validate", local, *image, *listed, "--json")
        assert not [e for e in json.loads(out)["validationErrors"] if "image" in e], out
        assert "/v2/acme/charts/demo/manifests/1.2.3" in [path for path, _ in registry.requests], registry.requests
        code, out, err = await cli("helm", "render", chart, *login, "--plain-http-registry", "http://" + host)
        assert (code, out) == (2, "")
        assert err.startswith("nvcf-mono: --plain-http-registry: 'http://127.0.0.1:"), err
        assert "is not a server as an image names it (host or host:port" in err
