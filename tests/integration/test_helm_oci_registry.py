"""Charts in a real OCI registry (Debian's ``docker-registry``, over TLS, with basic authentication), pushed
the way ``helm push`` stores them and pulled by the platform: through the renderer, and through the
platform's ``/v1/render`` with a function's ``helmRegistryAuthConfig``. CI installs the registry
(``.ci/run``) and sets NVCF_MONO_REQUIRE_CONTAINERS, so these run there; elsewhere they are skipped where
``docker-registry`` is missing.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import ssl
from pathlib import Path

import aiohttp
import pytest

from nvcf_mono.helm import HelmRenderError, RegistryCredential, RendererOptions, RenderRequest, render_chart
from nvcf_mono.helm.images import NO_CREDENTIAL, ImageChecker
from nvcf_mono.testing.container_images import registry_server
from nvcf_mono.testing.running import platform
from nvcf_mono.tls import development_certificate
from tests.function_charts import write_chart
from tests.unit.helm.charts import package

AUTH = {"Authorization": "Basic " + base64.b64encode(b"alice:wonderland").decode()}


@pytest.fixture
def tls(tmp_path: Path) -> tuple[Path, Path, Path]:
    """The registry's certificate and key, and the CA that signed them."""
    if shutil.which("docker-registry") is None:
        if os.environ.get("NVCF_MONO_REQUIRE_CONTAINERS"):
            pytest.fail("docker-registry is not installed, and NVCF_MONO_REQUIRE_CONTAINERS says this must run")
        pytest.skip("docker-registry is not installed (apt-get install docker-registry apache2-utils)")
    files = development_certificate(tmp_path / "tls", ["localhost", "127.0.0.1"])
    assert files.ca is not None
    return files.cert, files.key, files.ca


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


async def _push(host: str, ca: Path, repository: str, tag: str, archive: bytes) -> None:
    """What ``helm push`` sends: two blobs (the chart's config and the archive), then the manifest."""
    config = json.dumps({"name": repository.rsplit("/", 1)[-1], "version": tag, "apiVersion": "v2"}).encode()
    context = ssl.create_default_context(cafile=str(ca))
    base = f"https://{host}/v2/{repository}"
    async with aiohttp.ClientSession(headers=AUTH) as session:
        for blob in (config, archive):
            async with session.post(f"{base}/blobs/uploads/", ssl=context) as started:
                assert started.status == 202, await started.text()
                location = started.headers["Location"]
            upload = location if "://" in location else f"https://{host}{location}"
            params = {"digest": _digest(blob)}
            headers = {"Content-Type": "application/octet-stream"}
            async with session.put(upload, params=params, data=blob, headers=headers, ssl=context) as done:
                assert done.status == 201, await done.text()
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.cncf.helm.config.v1+json",
                "digest": _digest(config),
                "size": len(config),
            },
            "layers": [
                {
                    "mediaType": "application/vnd.cncf.helm.chart.content.v1.tar+gzip",
                    "digest": _digest(archive),
                    "size": len(archive),
                }
            ],
        }
        headers = {"Content-Type": "application/vnd.oci.image.manifest.v1+json"}
        async with session.put(
            f"{base}/manifests/{tag}", data=json.dumps(manifest), headers=headers, ssl=context
        ) as stored:
            assert stored.status == 201, await stored.text()


def _archive(tmp_path: Path, name: str, version: str) -> bytes:
    chart = write_chart(tmp_path / f"src-{version}", name=name, version=version)
    return package(chart, tmp_path / f"dist-{version}").read_bytes()


async def test_a_chart_in_a_real_registry_is_pulled_with_its_credentials(
    tmp_path: Path, tls: tuple[Path, Path, Path]
) -> None:
    cert, key, ca = tls
    with registry_server(tmp_path / "registry", tls=(cert, key)) as host:
        for version in ("1.2.0", "1.10.0"):
            await _push(host, ca, "acme/charts/inference-test", version, _archive(tmp_path, "inference-test", version))
        tenant = RendererOptions(ca_file=ca, chart_networks=("127.0.0.1/32",))
        credentials = {host: RegistryCredential("alice", "wonderland")}
        for chart, version in (
            (f"oci://{host}/acme/charts/inference-test-1.2.0.tgz", "1.2.0"),
            (f"oci://{host}/acme/charts/inference-test", "1.10.0"),
        ):
            request = RenderRequest(chart=chart, release="web", credentials=credentials)
            result = await render_chart(request, renderer="sdk", options=tenant)
            assert (result.chart_name, result.chart_version) == ("inference-test", version)
            assert any(obj["kind"] == "Deployment" for obj in result.objects)
        # The image check (validateImages) asks the same registry for a manifest: basic authentication here.
        checker = ImageChecker(tenant)
        pushed, absent = f"{host}/acme/charts/inference-test:1.2.0", f"{host}/acme/charts/inference-test:9.9.9"
        assert await checker.check([pushed], [credentials]) == []
        assert await checker.check([pushed], []) == [NO_CREDENTIAL + pushed]
        (missing,) = await checker.check([absent], [credentials])
        assert missing.startswith(f"cannot check image {absent}: it is not in its registry (HTTP 404 Not Found")
        wrong = {host: RegistryCredential("alice", "looking-glass")}
        with pytest.raises(HelmRenderError, match=r"no credential was valid to pull chart .*manually verify"):
            chart = f"oci://{host}/acme/charts/inference-test-1.2.0.tgz"
            await render_chart(RenderRequest(chart=chart, credentials=wrong), renderer="sdk", options=tenant)


async def test_the_platform_renders_a_functions_chart_from_its_registry(
    tmp_path: Path, tls: tuple[Path, Path, Path]
) -> None:
    cert, key, ca = tls
    with registry_server(tmp_path / "registry", tls=(cert, key)) as host:
        await _push(host, ca, "acme/charts/inference-test", "1.0.0", _archive(tmp_path, "inference-test", "1.0.0"))
        # A name, as a function's chart URL has (an address literal of a private network is refused at once).
        named = host.replace("127.0.0.1", "localhost")
        settings = {"plugins.helm.ca_file": str(ca), "plugins.helm.chart_networks": '["127.0.0.1/32"]'}
        async with platform(tmp_path / "p", **settings) as p:
            body = {
                "helmChart": f"oci://{named}/acme/charts/inference-test-1.0.0.tgz",
                "helmChartServiceName": "inference-svc",
                "helmChartServicePort": 8001,
            }
            auth = base64.b64encode(b"alice:wonderland").decode()
            secrets = {"k8sSecrets": [{"auths": {named: {"auth": auth}}}]}
            reply = await p.admin.post("/v1/render", {**body, "helmRegistryAuthConfig": secrets})
            assert reply.status == 200, reply.body
            assert reply.json["valid"] is True, reply.json
            assert any(obj["kind"] == "Deployment" for obj in reply.json["output"])
            reply = await p.admin.post("/v1/render", body)
            assert reply.json["valid"] is False
            (error,) = reply.json["validationErrors"]
            chart = f"oci://{named}/acme/charts/inference-test-1.0.0.tgz"
            assert error == (
                f'run helm template: no credential was valid to pull chart "{chart}", manually verify credentials '
                "are valid"
            )
