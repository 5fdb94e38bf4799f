"""Pulling a function's image for the container engine through the platform's own https client.

An image reference is a tenant's: if the engine pulled it, the engine would connect wherever the name
pointed (a loopback port, the cloud's metadata address, a host on the operator's network) and its
errors would tell the tenant what it found there. So the platform reads the image from its registry
itself, through :class:`~nvcf_mono.helm.download.Fetcher` (every address checked as it is dialled: the
registry, its token service, the blob storage it redirects to; https only; credentials only to the
registry), checks every blob against its digest, and hands the engine a ``docker save`` archive to
load (``POST /images/load``, which Docker and Podman both take, compressed layers included).

An image pinned by digest is named ``<registry>/<repository>:sha256-<hex>`` on the host (an archive
can carry tags, not digests), so ``IfNotPresent`` finds it again.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import tarfile
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import attrs

from nvcf_mono.contracts.pull_credentials import DOCKER_HUB
from nvcf_mono.helm.download import Fetcher, NotFound, TooLarge, Unauthorized, status_text
from nvcf_mono.helm.errors import HelmRenderError
from nvcf_mono.helm.images import DOCKER_HUB_API, ImageRef, parse_image
from nvcf_mono.helm.model import RegistryCredential
from nvcf_mono.helm.oci import (
    DOCKER_MANIFEST,
    INDEXES,
    OCI_MANIFEST,
    OciReference,
    Registry,
    is_digest,
    matches,
    says,
)
from nvcf_mono.printable import one_line

IMAGE_CONFIGS = ("application/vnd.oci.image.config.v1+json", "application/vnd.docker.container.image.v1+json")
#: Layers the engines unpack: plain, gzip or zstd tar (OCI's names, then Docker's).
LAYERS = (
    "application/vnd.oci.image.layer.v1.tar",
    "application/vnd.oci.image.layer.v1.tar+gzip",
    "application/vnd.oci.image.layer.v1.tar+zstd",
    "application/vnd.docker.image.rootfs.diff.tar",
    "application/vnd.docker.image.rootfs.diff.tar.gzip",
)
_CONFIG_LIMIT = 16 * 1024 * 1024
_CHUNK = 1024 * 1024
#: Layers read at once (the engines' own default for a pull is 3).
CONCURRENT_LAYERS = 3
#: More layers than overlay storage stacks (Docker stops at 125, Podman's overlay near 500).
MAX_LAYERS = 500
#: A layer may take as long as it takes (the caller's deadline bounds the pull), but not stall.
_STREAM_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=120)
_PLAIN_HTTP = " (image_pulls: engine lets the engine pull from a plain-http registry it is configured for)"
#: Python's names for machines, as image indexes name them.
_ARCHITECTURES = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


class ImagePullError(Exception):
    """The image could not be pulled: the message says why, naming the image."""


def host_architecture() -> str:
    machine = platform.machine().lower()
    return _ARCHITECTURES.get(machine, machine)


@attrs.frozen
class PullOptions:
    """Where the archive is written, what may be reached, and how large an image may be."""

    ca_file: Path | None
    networks: Sequence[str]
    networks_setting: str
    max_size: int
    architecture: str = attrs.field(factory=host_architecture)


def local_name(ref: ImageRef) -> str:
    """The name the image has on the host once loaded: the reference, or for a digest the tag
    ``<algorithm>-<hex>`` (tags hold at most 128 characters).
    """
    if ref.digest is None:
        return f"{ref.registry}/{ref.repository}:{ref.tag}"
    return f"{ref.registry}/{ref.repository}:{ref.digest.replace(':', '-')[:128]}"


def parse(image: str) -> ImageRef:
    """``image`` with Docker's defaults; :class:`ImagePullError` says what is wrong with it."""
    try:
        return parse_image(image)
    except ValueError as err:
        raise ImagePullError(str(err)) from err


async def pull_archive(
    ref: ImageRef, credentials: Sequence[RegistryCredential], options: PullOptions, archive: Path
) -> RegistryCredential | None:
    """Write ``ref``'s image for this host's architecture to ``archive`` (a ``docker save`` tar); the
    credential that read it (None: anonymously).
    """

    async def pull(fetcher: Fetcher, registry: Registry) -> None:
        await _pull(fetcher, registry, ref, options, archive)

    return await _with_credentials(ref, credentials, options, pull)


async def readable(
    ref: ImageRef, credentials: Sequence[RegistryCredential], options: PullOptions
) -> RegistryCredential | None:
    """Whether ``credentials`` (or none) can read ``ref``'s manifest: the credential that can (None:
    anyone can); :class:`ImagePullError` when none can.
    """

    async def read(fetcher: Fetcher, registry: Registry) -> None:
        await registry.document(ref.wanted)

    return await _with_credentials(ref, credentials, options, read)


async def _with_credentials(
    ref: ImageRef,
    credentials: Sequence[RegistryCredential],
    options: PullOptions,
    action: Callable[[Fetcher, Registry], Awaitable[None]],
) -> RegistryCredential | None:
    """Run ``action`` with each credential for the registry in turn, then none, until one is not refused;
    the one it ran with. A manifest not found moves on too (registries may hide what a credential cannot
    read); any other failure ends it, so a layer is not read again for nothing.
    """
    api = DOCKER_HUB_API if ref.registry == DOCKER_HUB else ref.registry
    target = OciReference(registry=api, repository=ref.repository, tag=ref.tag, digest=ref.digest)
    missing: NotFound | None = None
    for credential in [*credentials, None]:
        try:
            fetcher = Fetcher(  # a CA bundle that cannot be read says so here
                f"image {ref}",
                "pull",
                ca_file=options.ca_file,
                networks=options.networks,
                networks_setting=options.networks_setting,
                plain_http_hint=_PLAIN_HTTP,
            )
            async with fetcher:
                await action(fetcher, Registry(fetcher, target, credential))
                return credential
        except Unauthorized:
            continue
        except NotFound as err:
            missing = missing or err
            continue
        except HelmRenderError as err:
            raise ImagePullError(str(err)) from err
    if missing is not None:
        raise ImagePullError(str(missing)) from missing
    raise ImagePullError(f'no credential was valid to pull image "{ref}", manually verify credentials are valid')


async def _pull(fetcher: Fetcher, registry: Registry, ref: ImageRef, options: PullOptions, archive: Path) -> None:
    manifest, kind = await registry.document(ref.wanted)
    if kind in INDEXES:
        manifest, kind = await registry.document(_for_architecture(fetcher, manifest, options.architecture))
    if kind not in (OCI_MANIFEST, DOCKER_MANIFEST) or manifest.get("schemaVersion") != 2:
        shown = one_line(kind)[:100] or "none"
        raise fetcher.fail(f"its manifest is not an image's (media type {shown}; schema 1 is not supported)")
    config = _descriptor(fetcher, manifest.get("config"), "its config")
    if config[2] not in IMAGE_CONFIGS:
        raise fetcher.fail(f"it is not a container image (its config's media type is {one_line(config[2])[:100]})")
    layers = manifest.get("layers")
    if not isinstance(layers, list) or not layers:
        raise fetcher.fail("its manifest lists no layers")
    if len(layers) > MAX_LAYERS:
        raise fetcher.fail(f"it has {len(layers)} layers, more than the {MAX_LAYERS} an engine stacks")
    described = [_descriptor(fetcher, layer, "a layer") for layer in layers]
    for _, _, media_type in described:
        if media_type not in LAYERS:
            raise fetcher.fail(f"it has a layer of a kind the engine does not load ({one_line(media_type)[:100]})")
    total = config[1] + sum(size for _, size, _ in described)
    if total > options.max_size:
        raise fetcher.fail(f"it is {total} bytes, more than the {options.max_size} the operator allows")

    got = await _config(fetcher, registry, config[0])
    config_name = f"{config[0].partition(':')[2]}.json"
    layer_names = [f"{digest.partition(':')[2]}.tar" for digest, _, _ in described]
    entry = {"Config": config_name, "RepoTags": [local_name(ref)], "Layers": layer_names}
    listing = json.dumps([entry]).encode()
    # Each distinct layer once (old images repeat the empty one), each written where the layout puts it.
    distinct = {digest: size for digest, size, _ in described}
    if any(distinct[digest] != size for digest, size, _ in described):
        raise fetcher.fail("its manifest gives one layer two sizes")
    layout = _Layout(
        [(config_name, len(got)), ("manifest.json", len(listing))]
        + [(f"{digest.partition(':')[2]}.tar", size) for digest, size in distinct.items()]
    )
    try:
        fd = await anyio.to_thread.run_sync(layout.create, archive, {config_name: got, "manifest.json": listing})
    except OSError as err:
        raise fetcher.fail(f"cannot write it to {archive.parent}: {err.strerror}") from err
    failed: list[HelmRenderError] = []
    waiting = iter(distinct.items())  # shared by the readers: each layer is taken by one

    async def reader() -> None:
        try:
            for digest, size in waiting:
                offset = layout.offset(f"{digest.partition(':')[2]}.tar")
                await _layer(fetcher, registry, (fd, offset), digest, size)
        except HelmRenderError as err:  # the first failure ends the others, and is the pull's
            failed.append(err)
            tg.cancel_scope.cancel()
        except OSError as err:
            failed.append(fetcher.fail(f"cannot write it to {archive.parent}: {err.strerror}"))
            tg.cancel_scope.cancel()

    try:
        async with anyio.create_task_group() as tg:
            for _ in range(min(CONCURRENT_LAYERS, len(distinct))):
                tg.start_soon(reader)
    finally:
        os.close(fd)
    if failed:
        raise failed[0]


def _for_architecture(fetcher: Fetcher, index: dict[str, Any], architecture: str) -> str:
    """The digest of the index's image for linux on ``architecture``."""
    entries = index.get("manifests")
    offered: list[str] = []
    for entry in entries if isinstance(entries, list) else []:
        if not isinstance(entry, dict) or not isinstance(entry.get("platform"), dict):
            continue
        where = entry["platform"]
        os_name, arch = str(where.get("os", "")), str(where.get("architecture", ""))
        if arch == "unknown":
            continue  # attestations (build provenance), not images
        offered.append(f"{os_name}/{arch}")
        digest = entry.get("digest")
        if os_name == "linux" and arch == architecture and isinstance(digest, str) and is_digest(digest):
            return digest
    shown = ", ".join(sorted(set(map(one_line, offered)))[:20]) or "none"
    raise fetcher.fail(f"it has no image for linux/{architecture} (its index offers: {shown[:400]})")


def _descriptor(fetcher: Fetcher, value: object, what: str) -> tuple[str, int, str]:
    """A descriptor's digest, size and media type."""
    if not isinstance(value, dict):
        raise fetcher.fail(f"its manifest has no valid descriptor for {what}")
    digest, size, media_type = value.get("digest"), value.get("size"), value.get("mediaType")
    if not isinstance(digest, str) or not is_digest(digest):
        raise fetcher.fail(f"{what} has no valid digest")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise fetcher.fail(f"{what} has no valid size")
    return digest, size, media_type if isinstance(media_type, str) else ""


async def _config(fetcher: Fetcher, registry: Registry, digest: str) -> bytes:
    try:
        got = await registry.fetch(registry.url(f"blobs/{digest}"), limit=_CONFIG_LIMIT)
    except TooLarge:
        raise fetcher.fail(f"its config is larger than {_CONFIG_LIMIT} bytes") from None
    _check_status(fetcher, got.status, got.status_text(), f"its config {digest}", says(got.body))
    if not matches(got.body, digest):
        raise fetcher.fail(f"the config the registry sent does not match its digest {digest}")
    return got.body


async def _layer(fetcher: Fetcher, registry: Registry, where: tuple[int, int], digest: str, size: int) -> None:
    """Stream one layer into the archive (``where``: its file descriptor, the layer's offset), checking its
    size and digest as it comes.
    """
    fd, offset = where
    hasher = hashlib.new(digest.partition(":")[0])
    url = registry.url(f"blobs/{digest}")
    async with fetcher.open(url, headers=registry.authorization, timeout=_STREAM_TIMEOUT) as got:
        if got.status != 200:
            body = await got.content.read(16 * 1024)
            text = status_text(got.status, got.reason)
            _check_status(fetcher, got.status, text, f"the layer {digest}", says(body))
        written = 0
        pending = bytearray()
        async for chunk in got.content.iter_chunked(_CHUNK):
            if written + len(pending) + len(chunk) > size:
                raise fetcher.fail(f"the registry sent more than the {size} bytes of the layer {digest}")
            pending += chunk
            if len(pending) >= _CHUNK:
                written += await anyio.to_thread.run_sync(_write, fd, offset + written, bytes(pending), hasher)
                pending.clear()
        written += await anyio.to_thread.run_sync(_write, fd, offset + written, bytes(pending), hasher)
    if written != size or f"{digest.partition(':')[0]}:{hasher.hexdigest()}" != digest:
        raise fetcher.fail(f"the layer the registry sent does not match its digest {digest}")


def _write(fd: int, offset: int, data: bytes, hasher: Any) -> int:
    hasher.update(data)
    _pwrite_all(fd, data, offset)
    return len(data)


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        done = os.pwrite(fd, view, offset)
        view, offset = view[done:], offset + done


def _check_status(fetcher: Fetcher, status: int, text: str, what: str, said: str) -> None:
    if status == 200:
        return
    if status in (401, 403):
        raise Unauthorized(fetcher.fail(f"{text} for {what}: check the registry credentials"))
    raise fetcher.fail(f"{text} for {what}{said}")


class _Layout:
    """A tar's members at offsets known before their bytes are (each header PAX, for layers past 8 GiB), so
    layers can be written as they arrive, several at once; padding and the end are the file's zeros.
    """

    def __init__(self, members: Sequence[tuple[str, int]]) -> None:
        self._headers: dict[str, tuple[int, bytes]] = {}
        self._offsets: dict[str, int] = {}
        at = 0
        for name, size in members:
            info = tarfile.TarInfo(name)
            info.size = size
            info.mode = 0o644
            header = info.tobuf(format=tarfile.PAX_FORMAT)
            self._headers[name] = (at, header)
            at += len(header)
            self._offsets[name] = at
            at += size + (-size % tarfile.BLOCKSIZE)
        self.size = at + 2 * tarfile.BLOCKSIZE

    def offset(self, name: str) -> int:
        return self._offsets[name]

    def create(self, path: Path, contents: dict[str, bytes]) -> int:
        """Open ``path`` (never through a link), size it (zeros), write every header and the members already
        in hand; its file descriptor, for the rest.
        """
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.ftruncate(fd, self.size)
            for at, header in self._headers.values():
                _pwrite_all(fd, header, at)
            for name, data in contents.items():
                _pwrite_all(fd, data, self._offsets[name])
        except BaseException:
            os.close(fd)
            raise
        return fd
