"""Pulling a function's image for the container engine through the platform's own https client.

An image reference is a tenant's: if the engine pulled it, the engine would connect wherever the name
pointed (a loopback port, the cloud's metadata address, a host on the operator's network) and its
errors would tell the tenant what it found there. So the platform reads the image from its registry
itself, through :class:`~nvcf_mono.helm.download.Fetcher` (every address checked as it is dialled: the
registry, its token service, the blob storage it redirects to; https only; credentials only to the
registry), checks every blob against its digest, and hands the engine a ``docker save`` archive to
load (``POST /images/load``, which Docker and Podman both take, compressed layers included).

Layers the host already has are not read again (a new version of a function usually changes its top
layers only, over gigabytes of the same base): given their diff IDs, the archive is an OCI layout
instead, whose manifest names each such layer by its diff ID with no blob; Podman finds it in its
store and reads nothing for it.

An image pinned by digest is named ``<registry>/<repository>:sha256-<hex>`` on the host (an archive
can carry tags, not digests), so ``IfNotPresent`` finds it again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import tarfile
from collections.abc import Awaitable, Callable, Container, Sequence
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
from nvcf_mono.planes.compute.backends.containers.engine import Engine, EngineError
from nvcf_mono.printable import one_line

#: An uncompressed layer, as OCI names it (a layer left out of an archive is named this way).
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar"
#: Docker's names for layers, as OCI's.
_AS_OCI = {
    "application/vnd.docker.image.rootfs.diff.tar": OCI_LAYER,
    "application/vnd.docker.image.rootfs.diff.tar.gzip": "application/vnd.oci.image.layer.v1.tar+gzip",
}
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
_PLAIN_HTTP = " (unless the cluster's containers.plain_http_registries lists it)"
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
    #: Registries (``host[:port]``) read over plain http, the operator's.
    plain_http: Sequence[str] = ()


@attrs.frozen
class Pulled:
    """What a pull read: with which credential (None: anonymously), and what it found on the host."""

    read_by: RegistryCredential | None
    #: Layers left out of the archive (the engine has them), and the bytes the registry would have sent.
    reused_layers: int = 0
    reused_bytes: int = 0


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
    ref: ImageRef,
    credentials: Sequence[RegistryCredential],
    options: PullOptions,
    archive: Path,
    on_host: Container[str] = frozenset(),
) -> Pulled:
    """Write ``ref``'s image for this host's architecture to ``archive`` for the engine to load: a ``docker
    save`` tar, or, when some of its layers' diff IDs are ``on_host``, an OCI layout without them.
    """
    reused: list[tuple[int, int]] = []  # (layers, bytes) of the last try

    async def pull(fetcher: Fetcher, registry: Registry) -> None:
        reused[:] = [await _pull(fetcher, registry, ref, options, archive, on_host=on_host)]

    read_by = await _with_credentials(ref, credentials, options, pull)
    layers, size = reused[0]
    return Pulled(read_by, layers, size)


async def pull_and_load(
    engine: Engine,
    ref: ImageRef,
    credentials: Sequence[RegistryCredential],
    options: PullOptions,
    *,
    archive: Path,
    on_host: Container[str],
    timeout: float,
    log: tuple[logging.Logger, str],
) -> Pulled:
    """:func:`pull_archive`, then ``engine`` loads it (within ``timeout``). An archive that leaves layers out
    for the engine to find may fail to load (a layer removed since it was listed): then every layer is
    read and loaded. ``log``: where to say so, and whose pull it is.
    """
    logger, who = log
    pulled = await pull_archive(ref, credentials, options, archive, on_host)
    if not pulled.reused_layers:
        await engine.load(archive, timeout)
        return pulled
    logger.info(
        "%s: %d of its layers are on this host already (%d bytes not read)",
        who,
        pulled.reused_layers,
        pulled.reused_bytes,
    )
    try:
        await engine.load(archive, timeout)
    except EngineError as err:
        logger.warning("%s: the engine did not load it with the layers it has (%s); reading them all", who, err.message)
        pulled = await pull_archive(ref, credentials, options, archive)
        await engine.load(archive, timeout)
    return pulled


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
                plain_http=options.plain_http,
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


async def _pull(
    fetcher: Fetcher, registry: Registry, ref: ImageRef, options: PullOptions, archive: Path, *, on_host: Container[str]
) -> tuple[int, int]:
    """The image into ``archive``; how many layers were left out (``on_host``) and their size."""
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
    sizes = {digest: size for digest, size, _ in described}
    if any(sizes[digest] != size for digest, size, _ in described):
        raise fetcher.fail("its manifest gives one layer two sizes")

    got = await _config(fetcher, registry, config[0])
    # Each layer with the diff ID it is known by on the host, or None: its blob is read.
    reused = [
        (layer, d if d is not None and d in on_host else None)
        for layer, d in zip(described, _diff_ids(got, len(described)), strict=True)
    ]
    kept = [layer for layer, diff_id in reused if diff_id is None]
    if len(kept) == len(described):
        files, blobs = _docker_save(ref, config[0], got, described)
    else:
        files, blobs = _oci_layout(ref, (config[0], got), reused)
    # Each blob once (old images repeat the empty layer; a blob may be the config too), where the layout puts it.
    wanted = {blobs[digest]: (digest, size) for digest, size, _ in kept if blobs[digest] not in files}
    members = [(name, None if data is None else len(data)) for name, data in files.items()]
    layout = _Layout(members + [(name, size) for name, (_, size) in wanted.items()])
    written = {name: data for name, data in files.items() if data is not None}
    try:
        fd = await anyio.to_thread.run_sync(layout.create, archive, written)
    except OSError as err:
        raise fetcher.fail(f"cannot write it to {archive.parent}: {err.strerror}") from err
    failed: list[HelmRenderError] = []
    waiting = iter(wanted.items())  # shared by the readers: each blob is taken by one

    async def reader() -> None:
        try:
            for name, (digest, size) in waiting:
                await _layer(fetcher, registry, (fd, layout.offset(name)), digest, size)
        except HelmRenderError as err:  # the first failure ends the others, and is the pull's
            failed.append(err)
            tg.cancel_scope.cancel()
        except OSError as err:
            failed.append(fetcher.fail(f"cannot write it to {archive.parent}: {err.strerror}"))
            tg.cancel_scope.cancel()

    try:
        async with anyio.create_task_group() as tg:
            for _ in range(min(CONCURRENT_LAYERS, len(wanted))):
                tg.start_soon(reader)
    finally:
        os.close(fd)
    if failed:
        raise failed[0]
    left_out = sizes.keys() - {digest for digest, _, _ in kept}
    return len(left_out), sum(sizes[digest] for digest in left_out)


def _diff_ids(config: bytes, count: int) -> list[str | None]:
    """Each layer's diff ID (the digest of its tar, uncompressed) as the config gives it; None for every
    layer when it gives no list of ``count`` digests (nothing is left out then).
    """
    try:
        data = json.loads(config)
    except ValueError:
        data = None
    rootfs = data.get("rootfs") if isinstance(data, dict) else None
    found = rootfs.get("diff_ids") if isinstance(rootfs, dict) else None
    if isinstance(found, list) and len(found) == count and all(isinstance(d, str) and is_digest(d) for d in found):
        return list(found)
    return [None] * count


#: A layout's files: name -> bytes written at once (None: a directory); and where each blob goes, by digest.
_Files = tuple[dict[str, bytes | None], dict[str, str]]


def _docker_save(ref: ImageRef, config: str, config_data: bytes, layers: Sequence[tuple[str, int, str]]) -> _Files:
    """``docker save``'s layout: ``manifest.json`` naming the config and the layers, each in a file of its own."""
    config_name = f"{config.partition(':')[2]}.json"
    blobs = {digest: f"{digest.partition(':')[2]}.tar" for digest, _, _ in layers}
    entry = {"Config": config_name, "RepoTags": [local_name(ref)], "Layers": [blobs[d] for d, _, _ in layers]}
    return {config_name: config_data, "manifest.json": json.dumps([entry]).encode()}, blobs


def _oci_layout(
    ref: ImageRef, config_blob: tuple[str, bytes], layers: Sequence[tuple[tuple[str, int, str], str | None]]
) -> _Files:
    """An OCI image layout; ``layers``: each layer's descriptor, and the diff ID of the layer on the host it
    is (None: none). Those are named by their diff ID, uncompressed, with no blob: Podman reuses the layer
    of that diff ID in its store (the size is not known here, and not read).
    """
    config, config_data = config_blob
    descriptors = []
    for (digest, size, media_type), diff_id in layers:
        if diff_id is not None:
            descriptors.append({"mediaType": OCI_LAYER, "digest": diff_id, "size": 0})
        else:
            descriptors.append({"mediaType": _AS_OCI.get(media_type, media_type), "digest": digest, "size": size})
    image = {"mediaType": IMAGE_CONFIGS[0], "digest": config, "size": len(config_data)}
    body = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": image, "layers": descriptors}
    manifest = json.dumps(body).encode()
    digest = f"sha256:{hashlib.sha256(manifest).hexdigest()}"
    named = {"org.opencontainers.image.ref.name": local_name(ref)}  # Podman takes a whole name here
    entry = {"mediaType": OCI_MANIFEST, "digest": digest, "size": len(manifest), "annotations": named}
    blobs = {d: _blob(d) for (d, _, _), _ in layers}
    files: dict[str, bytes | None] = {"oci-layout": b'{"imageLayoutVersion":"1.0.0"}', "blobs/": None}
    for algorithm in sorted({d.partition(":")[0] for d in [config, digest, *blobs]}):
        files[f"blobs/{algorithm}/"] = None
    files |= {"index.json": json.dumps({"schemaVersion": 2, "manifests": [entry]}).encode()}
    files |= {_blob(digest): manifest, _blob(config): config_data}
    return files, blobs


def _blob(digest: str) -> str:
    algorithm, _, hexadecimal = digest.partition(":")
    return f"blobs/{algorithm}/{hexadecimal}"


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

    def __init__(self, members: Sequence[tuple[str, int | None]]) -> None:
        """``members``: each name and size (None: a directory)."""
        self._headers: dict[str, tuple[int, bytes]] = {}
        self._offsets: dict[str, int] = {}
        at = 0
        for name, length in members:
            info = tarfile.TarInfo(name)
            size = info.size = length or 0
            info.mode = 0o644
            if length is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
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
