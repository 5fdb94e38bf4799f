"""The containers backend's own image pull (``image_pull``) against a registry that can misbehave: the test
registry of the chart tests (https, a token service, blobs redirected to storage on another origin),
holding images instead of charts. ``tests/integration/containers`` pulls from a real registry into a
real engine.
"""

from __future__ import annotations

import gzip
import io
import json
import logging
import os
import tarfile
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from nvcf_mono.helm.model import RegistryCredential
from nvcf_mono.planes.compute.backends.containers import image_access, image_pull
from nvcf_mono.planes.compute.backends.containers.image_access import ImageAccess
from nvcf_mono.planes.compute.backends.containers.image_pull import ImagePullError, PullOptions, local_name, parse
from tests.unit.helm.https_server import issue_tls
from tests.unit.helm.oci_registry import (
    PASSWORD,
    USER,
    VIEWER,
    VIEWER_PASSWORD,
    Registry,
    digest_of,
    running,
)

pytestmark = pytest.mark.anyio

IMAGE_CONFIG = "application/vnd.oci.image.config.v1+json"
GZIP_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
INDEX = "application/vnd.oci.image.index.v1+json"


def _layer(name: str, text: str) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.size = len(text)
        tar.addfile(info, io.BytesIO(text.encode()))
    return gzip.compress(raw.getvalue(), mtime=0)


def diff_id(layer: bytes) -> str:
    """The layer's digest uncompressed (gzip's, or as it is)."""
    try:
        return digest_of(gzip.decompress(layer))
    except gzip.BadGzipFile:
        return digest_of(layer)


def image(
    *,
    layers: tuple[bytes, ...] | None = None,
    config_type: str = IMAGE_CONFIG,
    layer_type: str = GZIP_LAYER,
    diff_ids: list[str] | None = None,
) -> tuple[bytes, dict[str, bytes]]:
    """An image's manifest and its blobs by digest (two small layers unless given; the config gives
    their diff IDs unless ``diff_ids`` does).
    """
    chosen = layers if layers is not None else (_layer("a.txt", "first"), _layer("b.txt", "second"))
    rootfs = {"type": "layers", "diff_ids": [diff_id(x) for x in chosen] if diff_ids is None else diff_ids}
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Cmd": ["/serve"]}, "rootfs": rootfs})
    config = config.encode()
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": config_type, "digest": digest_of(config), "size": len(config)},
        "layers": [{"mediaType": layer_type, "digest": digest_of(x), "size": len(x)} for x in chosen],
    }
    return json.dumps(manifest).encode(), {digest_of(config): config, **{digest_of(x): x for x in chosen}}


def index(entries: list[tuple[str, str, bytes]]) -> bytes:
    """An image index of (os, architecture, manifest) entries."""
    return json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": INDEX,
            "manifests": [
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "digest": digest_of(m),
                    "size": len(m),
                    "platform": {"os": os_name, "architecture": arch},
                }
                for os_name, arch, m in entries
            ],
        }
    ).encode()


def options(ca_file: Path, networks: tuple[str, ...] = ("127.0.0.1/32",), **changes: Any) -> PullOptions:
    values: dict[str, Any] = {
        "ca_file": ca_file,
        "networks": networks,
        "networks_setting": "containers.registry_networks",
        "max_size": 1024**3,
        "architecture": "amd64",
    }
    return PullOptions(**{**values, **changes})


def read_archive(path: Path) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The archive's manifest.json entry and its members."""
    with tarfile.open(path) as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]
    [entry] = json.loads(members["manifest.json"])
    return entry, members


def _host(registry: Registry) -> str:
    return registry.base.partition("://")[2]


def _login() -> list[RegistryCredential]:
    return [RegistryCredential(username=USER, password=PASSWORD)]


async def test_an_image_is_written_as_an_archive_the_engine_loads(tmp_path: Path) -> None:
    ca_file, context = issue_tls(tmp_path / "tls")
    manifest, blobs = image()
    registry = holding(manifest, blobs)
    async with running(registry, context):
        ref = parse(f"{_host(registry)}/acme/echo:1.0")
        archive = tmp_path / "image.tar"
        await image_pull.pull_archive(ref, _login(), options(ca_file), archive)

    entry, members = read_archive(archive)
    assert entry["RepoTags"] == [f"{_host(registry)}/acme/echo:1.0"] == [local_name(ref)]
    config = json.loads(manifest)["config"]["digest"]
    assert members[entry["Config"]] == blobs[config]
    layers = [x["digest"] for x in json.loads(manifest)["layers"]]
    assert [members[name] for name in entry["Layers"]] == [blobs[d] for d in layers]
    # The token went to the registry only; the storage it redirects blobs to got none.
    assert registry.storage_requests and all(auth is None for _, auth in registry.storage_requests)


async def test_many_layers_arrive_together_and_a_repeated_one_is_written_once(tmp_path: Path) -> None:
    ca_file, context = issue_tls(tmp_path / "tls")
    empty = _layer("empty", "")
    layers = (empty, *(os.urandom(300_000 + n) for n in range(6)), empty)
    manifest, blobs = image(layers=layers)
    registry = Registry()
    registry.push_manifest("acme/big", "1", manifest, blobs)
    async with running(registry, context):
        archive = tmp_path / "image.tar"
        await image_pull.pull_archive(parse(f"{_host(registry)}/acme/big:1"), _login(), options(ca_file), archive)
    entry, members = read_archive(archive)
    assert [members[name] for name in entry["Layers"]] == list(layers)
    assert len(members) == 2 + 7  # the config, manifest.json, each distinct layer once
    assert sum(1 for path, _ in registry.storage_requests if digest_of(empty) in path) == 1

    described = json.loads(manifest)
    described["layers"][-1]["size"] += 1
    registry.push_manifest("acme/big", "odd", json.dumps(described).encode(), blobs)
    async with running(registry, context):
        with pytest.raises(ImagePullError, match="gives one layer two sizes"):
            await image_pull.pull_archive(parse(f"{_host(registry)}/acme/big:odd"), _login(), options(ca_file), archive)


async def test_layers_on_the_host_are_left_out_of_an_oci_layout_and_not_read(tmp_path: Path) -> None:
    ca_file, context = issue_tls(tmp_path / "tls")
    base, middle, top = _layer("base", "a base"), _layer("middle", "changed"), _layer("top", "the same again")
    manifest, blobs = image(layers=(base, middle, top))
    registry = Registry()
    registry.push_manifest("acme/app", "2", manifest, blobs)
    # The same layers, but a config whose diff IDs do not say which layer is which.
    odd, odd_blobs = image(layers=(base, middle, top), diff_ids=[diff_id(base)])
    registry.push_manifest("acme/app", "odd", odd, odd_blobs)
    on_host = {diff_id(base), diff_id(top), digest_of(b"another layer")}
    async with running(registry, context):
        ref = parse(f"{_host(registry)}/acme/app:2")
        archive = tmp_path / "image.tar"
        pulled = await image_pull.pull_archive(ref, _login(), options(ca_file), archive, on_host)
        assert (pulled.reused_layers, pulled.reused_bytes) == (2, len(base) + len(top))
        read = [path for path, _ in registry.storage_requests]
        assert [path for path in read if digest_of(middle) in path] and not [
            path for path in read if digest_of(base) in path or digest_of(top) in path
        ]

        with tarfile.open(archive) as tar:
            assert {"blobs", "blobs/sha256"} <= {m.name for m in tar.getmembers() if m.isdir()}
            members = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]
        assert "manifest.json" not in members and json.loads(members["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
        [entry] = json.loads(members["index.json"])["manifests"]
        assert entry["annotations"]["org.opencontainers.image.ref.name"] == local_name(ref)
        written = members[f"blobs/sha256/{entry['digest'].partition(':')[2]}"]
        assert digest_of(written) == entry["digest"] and len(written) == entry["size"]
        described = json.loads(written)
        config = json.loads(manifest)["config"]["digest"]
        assert described["config"]["digest"] == config and members[f"blobs/sha256/{config.partition(':')[2]}"]
        assert described["layers"] == [
            {"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": diff_id(base), "size": 0},
            json.loads(manifest)["layers"][1],
            {"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": diff_id(top), "size": 0},
        ]
        layer_files = {name for name in members if name.startswith("blobs/")} - {
            f"blobs/sha256/{d.partition(':')[2]}" for d in (entry["digest"], config)
        }
        assert layer_files == {f"blobs/sha256/{digest_of(middle).partition(':')[2]}"}
        assert members[layer_files.pop()] == middle

        # Without diff IDs to go by, every layer is read, into docker save's layout.
        registry.storage_requests.clear()
        pulled = await image_pull.pull_archive(
            parse(f"{_host(registry)}/acme/app:odd"), _login(), options(ca_file), archive, on_host
        )
        assert pulled.reused_layers == 0 and len(registry.storage_requests) == 3 + 1  # the layers, the config
        entry, members = read_archive(archive)
        assert [members[name] for name in entry["Layers"]] == [base, middle, top]


async def test_an_index_gives_the_hosts_architecture_or_says_what_it_offers(tmp_path: Path) -> None:
    ca_file, context = issue_tls(tmp_path / "tls")
    amd, amd_blobs = image(layers=(_layer("arch", "amd64"),))
    arm, arm_blobs = image(layers=(_layer("arch", "arm64"),))
    registry = Registry()
    for manifest, blobs in ((amd, amd_blobs), (arm, arm_blobs)):
        registry.push_manifest("acme/multi", digest_of(manifest), manifest, blobs)
    registry.push_manifest("acme/multi", "2", index([("linux", "arm64", arm), ("linux", "amd64", amd)]), {})
    async with running(registry, context):
        ref = parse(f"{_host(registry)}/acme/multi:2")
        await image_pull.pull_archive(ref, _login(), options(ca_file), tmp_path / "a.tar")
        entry, members = read_archive(tmp_path / "a.tar")
        assert [members[name] for name in entry["Layers"]] == [_layer("arch", "amd64")]

        with pytest.raises(
            ImagePullError, match=r"no image for linux/s390x \(its index offers: linux/amd64, linux/arm64\)"
        ):
            await image_pull.pull_archive(ref, _login(), options(ca_file, architecture="s390x"), tmp_path / "b.tar")


async def test_a_digest_pins_the_image_and_names_it_on_the_host(tmp_path: Path) -> None:
    ca_file, context = issue_tls(tmp_path / "tls")
    manifest, blobs = image()
    registry = Registry()
    pinned = registry.push_manifest("acme/echo", "1.0", manifest, blobs)
    other, other_blobs = image(layers=(_layer("c.txt", "other"),))
    registry.push_manifest("acme/echo", "1.1", other, other_blobs)
    async with running(registry, context):
        ref = parse(f"{_host(registry)}/acme/echo@{pinned}")
        await image_pull.pull_archive(ref, _login(), options(ca_file), tmp_path / "a.tar")
        entry, _ = read_archive(tmp_path / "a.tar")
        assert entry["RepoTags"] == [f"{_host(registry)}/acme/echo:{pinned.replace(':', '-')}"]

        # The registry sends another manifest for that digest: refused, nothing of it used.
        registry.manifests[pinned] = other
        with pytest.raises(ImagePullError, match="does not match the digest"):
            await image_pull.pull_archive(ref, _login(), options(ca_file), tmp_path / "b.tar")


def holding(manifest: bytes, blobs: dict[str, bytes], **behaviour: Any) -> Registry:
    """A test registry holding one image as ``acme/echo:1.0``."""
    registry = Registry(**behaviour)
    registry.push_manifest("acme/echo", "1.0", manifest, blobs)
    return registry


async def refused(tmp_path: Path, registry: Registry, message: str, **changes: Any) -> None:
    """Pulling ``acme/echo:1.0`` from ``registry`` fails, saying ``message``."""
    ca_file, context = issue_tls(tmp_path / "tls")
    async with running(registry, context):
        ref = parse(f"{_host(registry)}/acme/echo:1.0")
        with pytest.raises(ImagePullError, match=message):
            await image_pull.pull_archive(ref, _login(), options(ca_file, **changes), tmp_path / "a.tar")


async def test_a_blob_that_does_not_match_its_digest_is_refused(tmp_path: Path) -> None:
    await refused(tmp_path, holding(*image(), corrupt_blobs=True), "does not match its digest")


async def test_a_layer_longer_than_its_size_is_cut_off(tmp_path: Path) -> None:
    layer = os.urandom(5000)  # a body the registry sends whole, past the size the manifest gives
    manifest, blobs = image(layers=(layer,))
    described = json.loads(manifest)
    described["layers"][0]["size"] = 100
    await refused(tmp_path, holding(json.dumps(described).encode(), blobs), "more than the 100 bytes")


async def test_an_image_larger_than_allowed_is_refused_before_its_layers_are_read(tmp_path: Path) -> None:
    registry = holding(*image())
    await refused(tmp_path, registry, "more than the 100 the operator allows", max_size=100)
    assert not registry.storage_requests


async def test_a_registry_on_an_address_not_listed_is_never_contacted(tmp_path: Path) -> None:
    ca_file, context = issue_tls(tmp_path / "tls")
    registry = holding(*image())
    async with running(registry, context):
        for name in (_host(registry), f"localhost:{_host(registry).rsplit(':', 1)[1]}"):
            with pytest.raises(ImagePullError) as caught:
                await image_pull.pull_archive(
                    parse(f"{name}/acme/echo:1.0"), _login(), options(ca_file, ()), tmp_path / "a.tar"
                )
            assert "loopback address" in str(caught.value), caught.value
            assert "containers.registry_networks" in str(caught.value), caught.value
    assert registry.requests == [] and registry.storage_requests == []


async def test_blob_storage_on_an_address_not_listed_is_not_followed(tmp_path: Path) -> None:
    ca_file, context = issue_tls(tmp_path / "tls")
    registry = holding(*image())
    async with running(registry, context):
        # The registry is allowed by name at its own port only if its storage is too: point storage elsewhere.
        registry.storage = "https://169.254.169.254"
        ref = parse(f"{_host(registry)}/acme/echo:1.0")
        with pytest.raises(ImagePullError, match=r"169\.254\.169\.254 is a link-local address"):
            await image_pull.pull_archive(ref, _login(), options(ca_file), tmp_path / "a.tar")


async def test_credentials_are_tried_in_turn_then_none(tmp_path: Path) -> None:
    ca_file, context = issue_tls(tmp_path / "tls")
    manifest, blobs = image()
    registry = Registry()
    registry.push_manifest("acme/public", "1", manifest, blobs)
    registry.push_manifest("acme/private", "1", manifest, blobs)
    registry.public.add("acme/public")
    wrong = [RegistryCredential(username=USER, password="not-it")]
    async with running(registry, context):
        host = _host(registry)
        # A wrong login is refused by the token service; anonymous then reads a public repository.
        await image_pull.pull_archive(parse(f"{host}/acme/public:1"), wrong, options(ca_file), tmp_path / "a.tar")
        await image_pull.pull_archive(
            parse(f"{host}/acme/private:1"), [*wrong, *_login()], options(ca_file), tmp_path / "b.tar"
        )
        with pytest.raises(
            ImagePullError, match=r'no credential was valid to pull image "127\.0\.0\.1:\d+/acme/private:1"'
        ):
            await image_pull.pull_archive(parse(f"{host}/acme/private:1"), wrong, options(ca_file), tmp_path / "c.tar")


async def test_a_registry_hiding_what_a_login_cannot_read_moves_on_to_the_next(tmp_path: Path) -> None:
    ca_file, context = issue_tls(tmp_path / "tls")
    registry = holding(*image(), hide_private=True)
    viewer = RegistryCredential(username=VIEWER, password=VIEWER_PASSWORD)
    async with running(registry, context):
        ref = parse(f"{_host(registry)}/acme/echo:1.0")
        # The viewer's token is told the repository does not exist; the robot's reads it.
        assert await image_pull.readable(ref, [viewer, *_login()], options(ca_file)) == _login()[0]
        with pytest.raises(ImagePullError, match=r"acme/echo:1\.0 is not in the registry \(HTTP 404"):
            await image_pull.readable(ref, [viewer], options(ca_file))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"config_type": "application/vnd.cncf.helm.config.v1+json"}, "it is not a container image"),
        ({"layer_type": "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip"}, "a layer of a kind the engine"),
        ({"layers": ()}, "lists no layers"),
        ({"layers": (b"layer",) * 501}, "it has 501 layers, more than the 500 an engine stacks"),
    ],
)
async def test_what_is_not_an_image_the_engine_loads_is_refused(
    tmp_path: Path, changes: dict[str, Any], message: str
) -> None:
    ca_file, context = issue_tls(tmp_path / "tls")
    manifest, blobs = image(**changes)
    registry = Registry()
    registry.push_manifest("acme/odd", "1", manifest, blobs)
    schema1 = json.dumps({"schemaVersion": 1, "mediaType": "application/vnd.docker.distribution.manifest.v1+json"})
    registry.push_manifest("acme/old", "1", schema1.encode(), {})
    async with running(registry, context):
        with pytest.raises(ImagePullError, match=message):
            await image_pull.pull_archive(
                parse(f"{_host(registry)}/acme/odd:1"), _login(), options(ca_file), tmp_path / "a.tar"
            )
        with pytest.raises(ImagePullError, match="schema 1 is not supported"):
            await image_pull.pull_archive(
                parse(f"{_host(registry)}/acme/old:1"), _login(), options(ca_file), tmp_path / "a.tar"
            )
    assert not registry.storage_requests


def test_image_names_on_the_host() -> None:
    assert local_name(parse("busybox")) == "docker.io/library/busybox:latest"
    assert local_name(parse("nvcr.io/org/team/app:1.2")) == "nvcr.io/org/team/app:1.2"
    digest = "sha256:" + "ab" * 32
    assert local_name(parse(f"nvcr.io/org/app:1.2@{digest}")) == f"nvcr.io/org/app:sha256-{'ab' * 32}"
    with pytest.raises(ImagePullError, match="invalid image reference"):
        parse("Upper/Case:1")


def test_who_may_start_an_image_is_kept_across_restarts_and_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = logging.getLogger("test")
    path = tmp_path / "state" / "image-access.json"
    access = ImageAccess(path, log)
    assert access.allows("reg/operator:1", "a")  # not the platform's pull: the operator's, anyone's
    access.pulled("reg/private:1", "a")
    access.pulled("reg/public:1", None)
    assert access.allows("reg/private:1", "a") and not access.allows("reg/private:1", "b")
    assert access.allows("reg/public:1", "b")
    access.shown("reg/private:1", "b")

    again = ImageAccess(path, log)  # a restarted agent
    assert again.allows("reg/private:1", "b") and not again.allows("reg/private:1", "c")
    again.pulled("reg/private:1", "c")  # read again (perhaps another image under the tag): c's alone
    assert not again.allows("reg/private:1", "a") and again.allows("reg/private:1", "c")

    monkeypatch.setattr(image_access, "LIMIT", 3)
    for n in range(5):
        again.pulled(f"reg/many:{n}", "a")
    kept = json.loads(path.read_bytes())
    assert list(kept) == ["reg/many:2", "reg/many:3", "reg/many:4"]


def test_an_unreadable_record_is_said_and_starts_empty(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "image-access.json"
    path.write_text("{not json")
    with caplog.at_level(logging.WARNING):
        access = ImageAccess(path, logging.getLogger("test"))
    assert "cannot read" in caplog.text and access.allows("reg/x:1", "a")


async def test_a_registry_that_does_not_speak_tls_is_named_so(tmp_path: Path) -> None:
    ca_file, _ = issue_tls(tmp_path / "tls")
    runner = web.AppRunner(web.Application())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        with pytest.raises(ImagePullError) as caught:
            await image_pull.pull_archive(parse(f"127.0.0.1:{port}/acme/echo:1"), [], options(ca_file), tmp_path / "a")
    finally:
        await runner.cleanup()
    # Not the OpenSSL error number read as the system's ("Operation not permitted").
    assert f"no TLS session with 127.0.0.1:{port} (wrong version number)" in str(caught.value), caught.value
    assert "containers.plain_http_registries lists it" in str(caught.value), caught.value


async def test_a_registry_the_operator_lists_is_read_over_plain_http_and_no_other(tmp_path: Path) -> None:
    ca_file, _ = issue_tls(tmp_path / "tls")
    manifest, blobs = image()
    registry = holding(manifest, blobs)
    async with running(registry, None):  # plain http, the registry and the blob storage it redirects to
        host, storage = _host(registry), registry.storage.partition("://")[2]
        ref = parse(f"{host}/acme/echo:1.0")
        archive = tmp_path / "image.tar"
        with pytest.raises(ImagePullError, match=r"https only \(unless the cluster's containers.plain_http_reg"):
            await image_pull.pull_archive(ref, _login(), options(ca_file), archive)
        with pytest.raises(ImagePullError, match="redirected to a non-https URL"):
            await image_pull.pull_archive(ref, _login(), options(ca_file, plain_http=(host,)), archive)
        # Listed, and at an address the operator allows: read as over https, every blob checked.
        await image_pull.pull_archive(ref, _login(), options(ca_file, plain_http=(host.upper(), storage)), archive)
        entry, members = read_archive(archive)
        assert entry["RepoTags"] == [local_name(ref)] and len(members) == 2 + 2
        with pytest.raises(ImagePullError, match=r"containers\.registry_networks"):
            await image_pull.pull_archive(ref, _login(), options(ca_file, (), plain_http=(host, storage)), archive)


async def test_a_ca_bundle_that_cannot_be_read_is_a_pull_error(tmp_path: Path) -> None:
    with pytest.raises(ImagePullError, match="cannot use the CA bundle"):
        await image_pull.pull_archive(parse("registry.example/a:1"), [], options(tmp_path / "none.pem"), tmp_path / "a")
