"""Whether a chart's images exist in their registries (ReVal's image validation, reference helm-validation
§3.7): each image's manifest is asked for, anonymously first, then with each of the request's image secrets
that names its registry, at most :data:`CONCURRENCY` at a time. What exists anonymously is remembered
for :data:`CACHE_SECONDS`.

Registries are a tenant's to name, so they are reached like a chart's host: through
:class:`~nvcf_mono.helm.download.Fetcher`, at public addresses and the operator's listed networks only.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence

import anyio
import attrs

from nvcf_mono.contracts.pull_credentials import DOCKER_HUB, registry_host, split_image
from nvcf_mono.helm.download import TooLarge, Unauthorized, chart_fetcher
from nvcf_mono.helm.errors import HelmRenderError
from nvcf_mono.helm.model import RegistryCredential, RendererOptions
from nvcf_mono.helm.oci import (
    MANIFEST_LIMIT,
    MANIFEST_TYPES,
    REGISTRY,
    REPOSITORY,
    TAG,
    OciReference,
    Registry,
    is_digest,
    says,
)

#: Where Docker Hub's registry API answers.
DOCKER_HUB_API = "registry-1.docker.io"
CONCURRENCY = 5
CACHE_SECONDS = 7 * 24 * 3600
CACHE_SIZE = 10_000
NO_CREDENTIAL = "no credential was valid to pull images, manually verify credentials are valid: "


@attrs.frozen
class ImageRef:
    """An image reference with Docker's defaults filled in (``bar`` is ``docker.io/library/bar:latest``)."""

    registry: str
    repository: str
    tag: str | None
    digest: str | None

    @property
    def wanted(self) -> str:
        """What its registry is asked for: the digest, else the tag."""
        return self.digest or self.tag or "latest"

    def __str__(self) -> str:
        tag = f":{self.tag}" if self.tag else ""
        digest = f"@{self.digest}" if self.digest else ""
        return f"{self.registry}/{self.repository}{tag}{digest}"


def parse_image(ref: str) -> ImageRef:
    """``ref`` normalized; ValueError says what is wrong with it."""

    def bad(why: str) -> ValueError:
        return ValueError(f"invalid image reference {ref!r}: {why}")

    if not ref or ref != ref.strip() or any(c.isspace() for c in ref):
        raise bad("it is empty or has spaces")
    rest, digest = ref, None
    if "@" in ref:
        rest, digest = ref.rsplit("@", 1)
    if digest is not None and not is_digest(digest):
        raise bad(f"{digest!r} is not a digest (sha256 or sha512)")
    registry, path = split_image(rest)
    if REGISTRY.fullmatch(registry) is None:
        raise bad(f"{registry!r} is not a registry's host name or address")
    head, _, last = path.rpartition("/")
    tag = None
    if ":" in last:
        last, tag = last.rsplit(":", 1)
        if TAG.fullmatch(tag) is None:
            raise bad(f"{tag!r} is not a tag")
    path = f"{head}/{last}" if head else last
    if registry == DOCKER_HUB and "/" not in path:
        path = f"library/{path}"
    if REPOSITORY.fullmatch(path) is None:
        raise bad("the repository name must be lowercase letters and digits, with . _ - inside a part")
    return ImageRef(registry=registry, repository=path, tag=tag or (None if digest else "latest"), digest=digest)


def credentials_for(secrets: Iterable[Mapping[str, RegistryCredential]], registry: str) -> list[RegistryCredential]:
    """The credentials the secrets hold for ``registry``, in order (Docker Hub under any of its names)."""
    found: list[RegistryCredential] = []
    for secret in secrets:
        for host, credential in secret.items():
            if registry_host(host) == registry and credential not in found:
                found.append(credential)
    return found


class ImageChecker:
    """Checks images with one set of options; remembers what exists anonymously."""

    def __init__(self, options: RendererOptions) -> None:
        self._options = options
        self._known: OrderedDict[str, float] = OrderedDict()

    async def check(self, images: Iterable[str], secrets: Sequence[Mapping[str, RegistryCredential]]) -> list[str]:
        """What is wrong with ``images`` (none: every one exists); each secret maps registry hosts to a
        credential. Bounded by the options' timeout.
        """
        errors: list[str] = []
        refs: list[ImageRef] = []
        for image in sorted(set(images)):
            try:
                refs.append(parse_image(image))
            except ValueError as err:
                errors.append(str(err))
        without: list[str] = []
        limiter = anyio.CapacityLimiter(CONCURRENCY)

        async def one(ref: ImageRef) -> None:
            async with limiter:
                problem = await self._one(ref, secrets)
            if problem == NO_CREDENTIAL:
                without.append(str(ref))
            elif problem is not None:
                errors.append(problem)

        try:
            with anyio.fail_after(self._options.timeout):
                async with anyio.create_task_group() as tg:
                    for ref in refs:
                        tg.start_soon(one, ref)
        except TimeoutError:
            return [f"checking the chart's images did not finish within {self._options.timeout:g}s"]
        if without:
            errors.append(NO_CREDENTIAL + ", ".join(sorted(without)))
        return sorted(errors)

    async def _one(self, ref: ImageRef, secrets: Sequence[Mapping[str, RegistryCredential]]) -> str | None:
        """None (it exists), :data:`NO_CREDENTIAL` (no credential could read it), or what went wrong."""
        key = str(ref)
        if self._known.get(key, 0.0) > time.monotonic():
            return None
        api = DOCKER_HUB_API if ref.registry == DOCKER_HUB else ref.registry
        target = OciReference(registry=api, repository=ref.repository, tag=ref.tag, digest=ref.digest)
        missing: str | None = None
        options = self._options
        for credential in [None, *credentials_for(secrets, ref.registry)]:
            fetcher = chart_fetcher(options, f"image {key}", "check")
            try:
                async with fetcher:
                    registry = Registry(fetcher, target, credential)
                    url = registry.url(f"manifests/{ref.wanted}")
                    got = await registry.fetch(url, limit=MANIFEST_LIMIT, accept=", ".join(MANIFEST_TYPES))
            except Unauthorized:
                continue
            except TooLarge:
                return f"cannot check image {key}: its manifest is larger than {MANIFEST_LIMIT} bytes"
            except HelmRenderError as err:
                return str(err)  # not reached, refused, not https: no credential changes that
            if got.status == 200:
                if credential is None:
                    self._remember(key)
                return None
            if got.status == 404:
                missing = f"cannot check image {key}: it is not in its registry ({got.status_text()}{says(got.body)})"
            elif got.status not in (401, 403):
                return f"cannot check image {key}: {got.status_text()}{says(got.body)}"
        return missing or NO_CREDENTIAL

    def _remember(self, key: str) -> None:
        self._known[key] = time.monotonic() + CACHE_SECONDS
        self._known.move_to_end(key)
        while len(self._known) > CACHE_SIZE:
            self._known.popitem(last=False)
