"""Charts pulled from OCI registries by the platform itself (both renderers): NVCF's and Helm's reference
forms, token and basic authentication, digests checked, credentials kept to their origin, and a tenant's
chart fetched only from allowed addresses, each checked as it is dialled.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from nvcf_mono.helm import HelmRenderError, RegistryCredential, RendererOptions, RenderRequest, render_chart
from nvcf_mono.helm.oci import newest_version, parse_reference
from tests.unit.helm.charts import package, write_chart
from tests.unit.helm.https_server import issue_tls
from tests.unit.helm.oci_registry import (
    ANONYMOUS,
    OCI_MANIFEST,
    PASSWORD,
    TOKEN,
    USER,
    Registry,
    chart_manifest,
    digest_of,
    running,
)

FAKE_HELM = Path(__file__).with_name("fake_helm.py")


def _archive(tmp_path: Path, version: str = "1.2.3") -> bytes:
    root = tmp_path / f"chart-{version}"
    return package(write_chart(root / "src", version=version), root / "dist").read_bytes()


def _host(registry: Registry) -> str:
    return registry.base.removeprefix("https://")


def _credentials(registry: Registry, password: str = PASSWORD) -> dict[str, RegistryCredential]:
    return {_host(registry): RegistryCredential(USER, password)}


async def _render(chart: str, options: RendererOptions, renderer: str = "sdk", **kwargs: object) -> str:
    request = RenderRequest(chart=chart, **kwargs)  # type: ignore[arg-type]
    result = await render_chart(request, renderer=renderer, options=options)
    assert result.chart_name == "demo"
    return result.chart_version


async def test_an_nvcf_chart_url_and_a_helm_reference_pull_the_same_chart(tmp_path: Path) -> None:
    ca_file, context = issue_tls(tmp_path)
    options = RendererOptions(ca_file=ca_file)
    registry = Registry()
    registry.push("acme/charts/demo", "1.2.3", _archive(tmp_path))
    async with running(registry, context):
        credentials = _credentials(registry)
        nvcf = f"oci://{_host(registry)}/acme/charts/demo-1.2.3.tgz"
        assert await _render(nvcf, options, credentials=credentials) == "1.2.3"
        # The credentials went to the token service only, the token to the registry only, and the blob
        # storage (another origin, behind a redirect) got neither.
        token_calls = [auth for path, auth in registry.requests if path.startswith("/token")]
        assert token_calls and all(auth and auth.startswith("Basic ") for auth in token_calls)
        assert f"Bearer {TOKEN}" in {auth for path, auth in registry.requests if path.startswith("/v2/")}
        assert registry.storage_requests and all(auth is None for _, auth in registry.storage_requests)
        assert await _render(f"oci://{_host(registry)}/acme/charts/demo:1.2.3", options, credentials=credentials)


async def test_the_helm_executable_is_handed_the_pulled_archive(tmp_path: Path) -> None:
    ca_file, context = issue_tls(tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "helm").write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE_HELM}" "$@"\n')
    (bin_dir / "helm").chmod(0o755)
    log = tmp_path / "helm.log"
    options = RendererOptions(ca_file=ca_file, environ={"PATH": str(bin_dir), "FAKE_HELM_LOG": str(log)})
    registry = Registry()
    registry.push("acme/charts/demo", "1.2.3", _archive(tmp_path))
    async with running(registry, context):
        chart = f"oci://{_host(registry)}/acme/charts/demo-1.2.3.tgz"
        assert await _render(chart, options, renderer="binary", credentials=_credentials(registry)) == "1.2.3"
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert [call[0] for call in calls] == ["show", "show", "template"]
    assert all(arg.endswith("chart.tgz") for arg in (calls[0][2], calls[2][2]))
    assert not any("oci://" in arg for call in calls for arg in call)


async def test_without_a_tag_the_newest_release_is_pulled(tmp_path: Path) -> None:
    ca_file, context = issue_tls(tmp_path)
    registry = Registry(public={"charts/demo"})
    for version in ("1.2.3", "1.10.0", "1.9.9", "2.0.0-rc.1"):
        registry.push("charts/demo", version, _archive(tmp_path, version))
    registry.push("charts/demo", "latest", _archive(tmp_path, "0.0.1"))
    async with running(registry, context):
        # Anonymous (a public repository): a token without credentials; the tags come in pages of two.
        assert await _render(f"oci://{_host(registry)}/charts/demo", RendererOptions(ca_file=ca_file)) == "1.10.0"
        assert sum(path.startswith("/v2/charts/demo/tags/list") for path, _ in registry.requests) >= 3
        assert {auth for path, auth in registry.requests if path.startswith("/v2/")} >= {f"Bearer {ANONYMOUS}"}


async def test_a_tag_list_too_long_to_read_whole_asks_for_a_version(tmp_path: Path) -> None:
    ca_file, context = issue_tls(tmp_path)
    registry = Registry(public={"charts/demo"})
    archive = _archive(tmp_path)
    # 20 pages of two tags are read; the newest is on the 21st page, so no version is guessed.
    for minor in range(41):
        registry.push("charts/demo", f"1.{minor:02}.0", archive)
    async with running(registry, context):
        chart = f"oci://{_host(registry)}/charts/demo"
        with pytest.raises(HelmRenderError, match=r"tag list of charts/demo goes on past the 20 pages .*; name the"):
            await _render(chart, RendererOptions(ca_file=ca_file))
        pages = {path for path, _ in registry.requests if path.startswith("/v2/charts/demo/tags/list")}
        assert len(pages) == 20
        assert await _render(f"{chart}:1.40.0", RendererOptions(ca_file=ca_file)) == "1.2.3"


def test_the_newest_version_follows_semantic_versioning() -> None:
    assert newest_version(["1.0.0", "1.10.0", "1.9.0", "latest", "v1.10.1_build.5", "2.0.0-rc.1"]) == "v1.10.1_build.5"
    assert newest_version(["2.0.0-rc.1", "2.0.0-rc.10", "2.0.0-rc.2", "2.0.0-beta", "2.0.0-rc"]) == "2.0.0-rc.10"
    assert newest_version(["1.0.0-alpha", "1.0.0-alpha.1"]) == "1.0.0-alpha.1"
    assert newest_version(["latest", "main"]) is None


async def test_a_digest_pins_the_chart(tmp_path: Path) -> None:
    ca_file, context = issue_tls(tmp_path)
    options = RendererOptions(ca_file=ca_file)
    registry = Registry(auth="none")
    pinned = registry.push("charts/demo", "1.2.3", _archive(tmp_path))
    async with running(registry, context):
        base = f"oci://{_host(registry)}/charts/demo"
        assert await _render(f"{base}@{pinned}", options) == "1.2.3"
        assert await _render(f"{base}:1.2.3@{pinned}", options) == "1.2.3"
        # A registry that answers a digest with other bytes is caught.
        other, _ = chart_manifest(_archive(tmp_path, "6.6.6"))
        registry.manifests[pinned] = other
        with pytest.raises(HelmRenderError, match=rf"manifest does not match the digest {pinned}"):
            await _render(f"{base}@{pinned}", options)


async def test_a_chart_layer_that_does_not_match_its_digest_is_refused(tmp_path: Path) -> None:
    ca_file, context = issue_tls(tmp_path)
    registry = Registry(auth="none", corrupt_blobs=True)
    registry.push("charts/demo", "1.2.3", _archive(tmp_path))
    async with running(registry, context):
        with pytest.raises(HelmRenderError, match=r"the chart layer the registry sent does not match its digest"):
            await _render(f"oci://{_host(registry)}/charts/demo:1.2.3", RendererOptions(ca_file=ca_file))


async def test_credentials_missing_or_wrong_are_named(tmp_path: Path) -> None:
    ca_file, context = issue_tls(tmp_path)
    options = RendererOptions(ca_file=ca_file)
    registry = Registry()
    registry.push("acme/charts/demo", "1.2.3", _archive(tmp_path))
    async with running(registry, context):
        chart = f"oci://{_host(registry)}/acme/charts/demo:1.2.3"
        # ReVal's words: each credential, then none; all refused.
        nothing = rf'^no credential was valid to pull chart "{chart}", manually verify credentials are valid$'
        with pytest.raises(HelmRenderError, match=nothing):
            await _render(chart, options)
        with pytest.raises(HelmRenderError, match=nothing) as caught:
            await _render(chart, options, credentials=_credentials(registry, "wrong"))
        assert "wrong" not in str(caught.value)
        # The first that works wins: a wrong one before a right one costs a token request, nothing more.
        host = _host(registry)
        both = {host: (RegistryCredential(USER, "wrong"), RegistryCredential(USER, PASSWORD))}
        assert await _render(chart, options, credentials=both) == "1.2.3"
        # A failure that is not a refusal is said as it is (and once, whichever credential met it).
        with pytest.raises(
            HelmRenderError, match=r"^cannot pull chart .*demo:9\.9\.9: acme/charts/demo:9\.9\.9 is not"
        ):
            await _render(chart.replace("1.2.3", "9.9.9"), options, credentials=both)


async def test_a_registry_asking_for_basic_authentication_gets_it(tmp_path: Path) -> None:
    ca_file, context = issue_tls(tmp_path)
    registry = Registry(auth="basic")
    registry.push("acme/charts/demo", "1.2.3", _archive(tmp_path))
    async with running(registry, context):
        chart = f"oci://{_host(registry)}/acme/charts/demo:1.2.3"
        assert await _render(chart, RendererOptions(ca_file=ca_file), credentials=_credentials(registry))
        assert registry.storage_requests and all(auth is None for _, auth in registry.storage_requests)
        with pytest.raises(HelmRenderError, match=r"no credential was valid to pull chart"):
            await _render(chart, RendererOptions(ca_file=ca_file))


async def test_what_is_not_a_chart_there_is_a_clear_error(tmp_path: Path) -> None:
    ca_file, context = issue_tls(tmp_path)
    options = RendererOptions(ca_file=ca_file, max_chart_size=2048)
    registry = Registry(auth="none")
    archive = _archive(tmp_path)
    registry.push("charts/demo", "1.2.3", archive)
    registry.push("charts/image", "1", archive, config_type="application/vnd.oci.image.config.v1+json")
    index = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": []})
    registry.push_manifest("charts/multi", "1", index.encode(), {})
    no_layer = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {"mediaType": "application/vnd.cncf.helm.config.v1+json", "digest": digest_of(b"{}"), "size": 2},
            "layers": [],
        }
    )
    registry.push_manifest("charts/empty", "1", no_layer.encode(), {})
    registry.push_manifest("charts/notjson", "1", b"<html>", {})
    registry.push_manifest("charts/versionless", "latest", no_layer.encode(), {})
    async with running(registry, context):
        host = _host(registry)
        cases = {
            f"oci://{host}/charts/demo:9.9.9": r"charts/demo:9\.9\.9 is not in the registry \(HTTP 404 Not Found: "
            r"manifest unknown\)",
            f"oci://{host}/charts/nothing": r"repository charts/nothing is not in the registry \(HTTP 404 Not Found: "
            r"repository name not known to registry\)",
            f"oci://{host}/charts/image:1": r"it is not a Helm chart \(its config's media type is "
            r"application/vnd\.oci\.image\.config\.v1\+json",
            f"oci://{host}/charts/multi:1": r"charts/multi:1 is an image index, not a Helm chart",
            f"oci://{host}/charts/empty:1": r"its manifest has no chart layer",
            f"oci://{host}/charts/notjson:1": r"the registry sent its manifest as something other than a JSON object",
            f"oci://{host}/charts/versionless": r"no tag of charts/versionless is a version; name one",
        }
        for chart, message in cases.items():
            with pytest.raises(HelmRenderError, match=rf"cannot pull chart {chart}: (?:{message})"):
                await _render(chart, options)
        # The layer's declared size is checked before it is fetched.
        small = RendererOptions(ca_file=ca_file, max_chart_size=len(archive) - 1)
        with pytest.raises(HelmRenderError, match=rf"it is larger than {len(archive) - 1} bytes"):
            await _render(f"oci://{host}/charts/demo:1.2.3", small)
        assert not registry.storage_requests


@pytest.mark.parametrize(
    ("ref", "why"),
    [
        ("oci://registry.example.com/Acme/demo:1", r"'Acme/demo' is not a repository name"),
        ("oci://registry.example.com/", "it names no repository"),
        ("oci://registry.example.com/demo:", r"'' is not a tag"),
        ("oci://registry.example.com/demo:1?x=y", "it has a query"),
        ("oci://registry.example.com/demo@sha256:abc", r"'sha256:abc' is not a sha256 or sha512 digest"),
        ("oci://bad_host!/demo:1", r"'bad_host!' is not a registry's host name"),
    ],
)
async def test_a_malformed_reference_is_refused_before_any_connection(ref: str, why: str) -> None:
    with pytest.raises(HelmRenderError, match=rf"is not an OCI chart reference: {why}.*; give oci://"):
        await _render(ref, RendererOptions())


def test_references_in_both_forms_are_read() -> None:
    nvcf = parse_reference("oci://nvcr.io/acme/team/charts/my-chart-0.1.0.tgz")
    assert (nvcf.registry, nvcf.repository, nvcf.tag, nvcf.digest) == (
        "nvcr.io",
        "acme/team/charts/my-chart",
        "0.1.0",
        None,
    )
    helm = parse_reference("oci://user:pw@Registry.Example.com:5000/charts/demo:1.2.3+build.1")
    assert (helm.registry, helm.repository, helm.tag) == ("registry.example.com:5000", "charts/demo", "1.2.3_build.1")


async def test_a_tenants_chart_is_pulled_only_from_allowed_addresses(tmp_path: Path) -> None:
    ca_file, context = issue_tls(tmp_path)
    tenant = RendererOptions(ca_file=ca_file, chart_networks=())
    listed = RendererOptions(ca_file=ca_file, chart_networks=("127.0.0.1/32",))
    registry = Registry()
    registry.push("acme/charts/demo", "1.2.3", _archive(tmp_path))
    async with running(registry, context):
        credentials = _credentials(registry)
        chart = f"oci://{_host(registry)}/acme/charts/demo-1.2.3.tgz"
        with pytest.raises(HelmRenderError, match=r"127\.0\.0\.1 is a loopback address.*plugins\.helm\.chart_networks"):
            await _render(chart, tenant, credentials=credentials)
        # A name is checked as it resolves: the address it resolves to is the one dialled.
        named = chart.replace("127.0.0.1", "localhost")
        with pytest.raises(
            HelmRenderError, match=r"cannot pull chart .*localhost: .*127\.0\.0\.1 is a loopback address"
        ):
            await _render(named, tenant)
        assert not registry.requests
        assert await _render(chart, listed, credentials=credentials) == "1.2.3"
        # The registry names its token service and its blob storage: each is checked like the registry.
        registry.realm = registry.base.replace("127.0.0.1", "127.0.0.2") + "/token"
        with pytest.raises(HelmRenderError, match=r"127\.0\.0\.2 is a loopback address"):
            await _render(chart, listed, credentials=credentials)
        registry.realm = registry.base.replace("https://", "http://") + "/token"
        with pytest.raises(HelmRenderError, match=r"http://127\.0\.0\.1:\d+/token\?.* is not an https URL"):
            await _render(chart, listed, credentials=credentials)
        registry.realm = None
        registry.storage = registry.storage.replace("127.0.0.1", "127.0.0.2")
        with pytest.raises(HelmRenderError, match=r"127\.0\.0\.2 is a loopback address"):
            await _render(chart, listed, credentials=credentials)


async def test_a_registry_the_operator_lists_is_pulled_from_over_plain_http(tmp_path: Path) -> None:
    registry = Registry()
    registry.push("acme/charts/demo", "1.2.3", _archive(tmp_path))
    async with running(registry, None):  # plain http: the registry, its token service, its blob storage
        host, storage = registry.base.partition("://")[2], registry.storage.partition("://")[2]
        chart = f"oci://{host}/acme/charts/demo-1.2.3.tgz"
        credentials = {host: RegistryCredential(USER, PASSWORD)}
        allowed = ("127.0.0.1/32",)
        unlisted = r"https only \(unless plugins\.helm\.plain_http_registries or --plain-http-registry lists"
        with pytest.raises(HelmRenderError, match=unlisted):
            await _render(chart, RendererOptions(chart_networks=allowed), credentials=credentials)
        # Listed, with its blob storage: pulled, digests checked as over https; the address is still checked.
        listed = RendererOptions(chart_networks=allowed, plain_http=(host, storage))
        assert await _render(chart, listed, credentials=credentials) == "1.2.3"
        with pytest.raises(HelmRenderError, match=r"127\.0\.0\.1 is a loopback address"):
            await _render(
                chart, RendererOptions(chart_networks=(), plain_http=(host, storage)), credentials=credentials
            )
