"""A chart's images checked in their registries (ReVal's image validation): Docker's defaults, anonymous
first and then each secret for the image's registry, one error naming every image no credential could
read, what exists anonymously remembered, and registries reached only where a tenant's may be.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from nvcf_mono.helm import RegistryCredential, RendererOptions
from nvcf_mono.helm.images import NO_CREDENTIAL, ImageChecker, credentials_for, parse_image
from tests.unit.helm.https_server import issue_tls
from tests.unit.helm.oci_registry import PASSWORD, USER, Registry, running

IMAGE_CONFIG = "application/vnd.oci.image.config.v1+json"


@pytest.mark.parametrize(
    ("ref", "normalized"),
    [
        ("bar", "docker.io/library/bar:latest"),
        ("foo/bar", "docker.io/foo/bar:latest"),
        ("index.docker.io/foo/bar:1", "docker.io/foo/bar:1"),
        (
            "77777777777.dkr.ecr.us-west-2.amazonaws.com/project/foo/bar-2:0.0.2",
            "77777777777.dkr.ecr.us-west-2.amazonaws.com/project/foo/bar-2:0.0.2",
        ),
        ("nvcr.io/nvidia/tritonserver:24.01-py3", "nvcr.io/nvidia/tritonserver:24.01-py3"),
        ("localhost:5000/app", "localhost:5000/app:latest"),
        ("ubuntu@sha256:" + "a" * 64, "docker.io/library/ubuntu@sha256:" + "a" * 64),
        ("Registry.Example.com:443/a/b:v1@sha256:" + "b" * 64, "registry.example.com:443/a/b:v1@sha256:" + "b" * 64),
    ],
)
def test_references_get_dockers_defaults(ref: str, normalized: str) -> None:
    assert str(parse_image(ref)) == normalized


@pytest.mark.parametrize(
    ("ref", "why"),
    [
        ("", "empty"),
        ("Foo/Bar", "lowercase"),
        ("bar:", "is not a tag"),
        ("bar@sha256:xyz", "is not a digest"),
        ("bar baz", "spaces"),
    ],
)
def test_malformed_references_say_what_is_wrong(ref: str, why: str) -> None:
    with pytest.raises(ValueError, match=rf"invalid image reference .*{why}"):
        parse_image(ref)


def test_a_registrys_credentials_come_from_each_secret_in_order() -> None:
    a, b = RegistryCredential("a", "1"), RegistryCredential("b", "2")
    secrets = [{"https://index.docker.io/v1/": a}, {"nvcr.io": b, "docker.io": b}, {"nvcr.io": b}]
    assert credentials_for(secrets, "docker.io") == [a, b]
    assert credentials_for(secrets, "nvcr.io") == [b]
    assert credentials_for(secrets, "ghcr.io") == []


async def test_images_are_checked_anonymously_then_with_each_secret(tmp_path: Path) -> None:
    ca_file, context = issue_tls(tmp_path)
    registry = Registry(public={"public/app"})
    for repository in ("public/app", "private/app"):
        registry.push(repository, "1.0", b"layer-of-" + repository.encode(), config_type=IMAGE_CONFIG)
    async with running(registry, context):
        host = registry.base.removeprefix("https://")
        checker = ImageChecker(RendererOptions(ca_file=ca_file))
        public, private, missing = f"{host}/public/app:1.0", f"{host}/private/app:1.0", f"{host}/public/app:2.0"
        wrong = [{host: RegistryCredential(USER, "nope")}]
        right = [{host: RegistryCredential(USER, PASSWORD)}]

        assert await checker.check([public], []) == []
        assert await checker.check([private], wrong + right) == []
        errors = await checker.check([private, public, "Not/Valid", missing], wrong)
        assert errors == sorted(
            [
                f"cannot check image {missing}: it is not in its registry (HTTP 404 Not Found: manifest unknown)",
                "invalid image reference 'Not/Valid': the repository name must be lowercase letters and digits, "
                "with . _ - inside a part",
                NO_CREDENTIAL + private,
            ]
        )
        # What exists anonymously is not asked for again; what needed a credential is.
        asked = len(registry.requests)
        assert await checker.check([public], []) == []
        assert len(registry.requests) == asked
        assert await checker.check([private], right) == []
        assert len(registry.requests) > asked


async def test_a_tenants_images_are_checked_only_at_allowed_addresses(tmp_path: Path) -> None:
    ca_file, context = issue_tls(tmp_path)
    registry = Registry(auth="none")
    registry.push("app", "1", b"layer", config_type=IMAGE_CONFIG)
    async with running(registry, context):
        host = registry.base.removeprefix("https://")
        tenant = ImageChecker(RendererOptions(ca_file=ca_file, chart_networks=()))
        errors = await tenant.check([f"{host}/app:1", host.replace("127.0.0.1", "localhost") + "/app:1"], [])
        assert len(errors) == 2
        for error in errors:
            assert "127.0.0.1 is a loopback address" in error and "plugins.helm.chart_networks" in error
        assert not registry.requests
        listed = ImageChecker(RendererOptions(ca_file=ca_file, chart_networks=("127.0.0.1/32",)))
        assert await listed.check([f"{host}/app:1"], []) == []
