"""Pulling a Helm chart from an OCI registry, as ``helm pull oci://...`` does, through the platform's own
https client (:class:`~nvcf_mono.helm.download.Fetcher`): every address it connects to is checked as
it dials (the registry, its token service, its blob storage), so a name that resolves elsewhere by the
time the chart is fetched reaches nothing it should not.

References take two forms:

- NVCF's ``oci://<registry>/<org>[/<team>]/charts/<name>-<version>.tgz``: the chart ``<name>`` at tag
  ``<version>`` in repository ``<org>[/<team>]/charts/<name>``, where ``helm push <name>-<version>.tgz
  oci://<registry>/<org>[/<team>]/charts`` puts it;
- Helm's ``oci://<registry>/<repository>[:<tag>][@<digest>]``; without a tag or digest, the newest
  semantic version among the repository's tags (a release before a pre-release), as Helm picks.

The chart layer is checked against its digest, and a digest in the reference against the manifest.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

import attrs
from yarl import URL

from nvcf_mono.helm.download import Fetched, Fetcher, NotFound, TooLarge, Unauthorized, basic_auth
from nvcf_mono.helm.errors import HelmRenderError
from nvcf_mono.helm.model import RegistryCredential
from nvcf_mono.helm.source import redact
from nvcf_mono.printable import one_line

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
INDEXES = ("application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json")
#: What a manifest is asked for as: an image's, or an index of them (a chart's is an image's).
MANIFEST_TYPES = (OCI_MANIFEST, DOCKER_MANIFEST, *INDEXES)
HELM_CONFIG = "application/vnd.cncf.helm.config.v1+json"
#: The chart's layer; the second is what Helm's experimental OCI support wrote before Helm 3.7.
CHART_LAYERS = ("application/vnd.cncf.helm.chart.content.v1.tar+gzip", "application/tar+gzip")

#: Registries refuse manifests larger than this (the distribution project's limit).
MANIFEST_LIMIT = 4 * 1024 * 1024
_TOKEN_LIMIT = 1024 * 1024
#: A tag list is read a page at a time, each at most this large, and no more pages than this (a
#: repository with more tags must be given a version).
_TAGS_LIMIT = 1024 * 1024
_TAGS_PAGE = 1000
_TAGS_PAGES = 20

_FORMS = "oci://<registry>/<repository>:<version> or oci://<registry>/<org>/charts/<name>-<version>.tgz"
_COMPONENT = r"[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*"
#: The distribution spec's grammar (images and charts alike): a repository, a tag, a registry (lower case).
REPOSITORY = re.compile(rf"{_COMPONENT}(?:/{_COMPONENT})*")
TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
REGISTRY = re.compile(
    r"(?:[a-z0-9](?:[a-z0-9-]*[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]*[a-z0-9])?)*|\[[0-9a-f:.]+\])(?::\d{1,5})?"
)
_DIGEST = re.compile(r"(?P<algorithm>sha256|sha512):(?P<hex>[a-f0-9]+)")
_HEX_LENGTH = {"sha256": 64, "sha512": 128}
#: NVCF's file form: the version starts with a digit, so ``my-chart-1.0.0.tgz`` is ``my-chart`` 1.0.0.
_CHART_FILE = re.compile(r"(?P<name>.+?)-(?P<version>\d[^/]*)\.tgz")
_SEMVER = re.compile(r"v?(\d+)(?:\.(\d+))?(?:\.(\d+))?(?:-([0-9A-Za-z.-]+))?(?:\+[0-9A-Za-z.-]+)?")
_CHALLENGE_PARAM = re.compile(r'([A-Za-z][A-Za-z0-9_-]*)=(?:"((?:[^"\\]|\\.)*)"|([^\s,"]+))')
_NEXT = re.compile(r'<([^>]*)>\s*;\s*rel="?next"?')


@attrs.frozen
class OciReference:
    """A chart in a registry: ``registry`` (host[:port]), ``repository``, and a ``tag`` or a ``digest``."""

    registry: str
    repository: str
    tag: str | None = None
    digest: str | None = None


def parse_reference(ref: str) -> OciReference:
    """The registry, repository, tag and digest ``ref`` names; :class:`HelmRenderError` says what is wrong."""

    def bad(why: str) -> HelmRenderError:
        return HelmRenderError(f"{redact(ref)} is not an OCI chart reference: {why}; give {_FORMS}")

    scheme, _, rest = ref.partition("://")
    if scheme.lower() != "oci":
        raise bad("it does not start with oci://")
    if any(c in rest for c in "?#\\") or any(c.isspace() for c in rest):
        raise bad("it has a query, a fragment, a backslash or a space")
    netloc, _, path = rest.partition("/")
    registry = netloc.rsplit("@", 1)[-1].lower()
    if not registry:
        raise bad("it names no registry")
    if REGISTRY.fullmatch(registry) is None:
        raise bad(f"{registry!r} is not a registry's host name or address, with an optional port")
    digest = None
    if "@" in path:
        path, digest = path.rsplit("@", 1)
        if not is_digest(digest):
            raise bad(f"{digest!r} is not a sha256 or sha512 digest")
    head, _, last = path.rpartition("/")
    tag = None
    chart_file = _CHART_FILE.fullmatch(last) if digest is None else None
    if chart_file is not None:
        path, tag = f"{head}/{chart_file['name']}" if head else chart_file["name"], chart_file["version"]
    elif ":" in last:
        name, tag = last.rsplit(":", 1)
        path = f"{head}/{name}" if head else name
    if not path:
        raise bad("it names no repository")
    if REPOSITORY.fullmatch(path) is None:
        raise bad(
            f"{path!r} is not a repository name (lowercase letters, digits and . _ - between them, / between parts)"
        )
    if tag is not None:
        tag = tag.replace("+", "_")  # OCI tags cannot hold '+': Helm writes a version's build part with '_'
        if TAG.fullmatch(tag) is None:
            raise bad(f"{tag!r} is not a tag (letters, digits and . _ -, at most 128)")
    return OciReference(registry=registry, repository=path, tag=tag, digest=digest)


async def pull_chart(fetcher: Fetcher, ref: str, credential: RegistryCredential | None, *, max_size: int) -> bytes:
    """The chart archive ``ref`` names, read from its registry through ``fetcher``."""
    reference = parse_reference(ref)
    registry = Registry(fetcher, reference, credential)
    wanted = reference.digest or reference.tag or await registry.newest_version()
    manifest = await registry.manifest(wanted)
    digest, size = _chart_layer(fetcher, manifest)
    if size > max_size:
        raise fetcher.fail(f"it is larger than {max_size} bytes")
    return await registry.blob(digest, size, max_size)


class Registry:
    """The distribution API of one repository, with the registry's own way of asking for credentials
    (a bearer token from its token service, or basic authentication) answered once.
    """

    def __init__(self, fetcher: Fetcher, reference: OciReference, credential: RegistryCredential | None) -> None:
        self._fetcher = fetcher
        self._ref = reference
        self._credential = credential
        scheme = fetcher.scheme(reference.registry)  # https, unless the operator listed it as plain http
        self._base = URL.build(scheme=scheme, authority=reference.registry, path=f"/v2/{reference.repository}/")
        self._authorization: dict[str, str] = {}
        self._challenged = False

    async def newest_version(self) -> str:
        tags: list[str] = []
        page: URL | None = self.url(f"tags/list?n={_TAGS_PAGE}")
        for _ in range(_TAGS_PAGES):
            if page is None:
                break
            got = await self._get(page, limit=_TAGS_LIMIT, what=f"repository {self._ref.repository}")
            listed = _json(self._fetcher, got, "its list of tags").get("tags") or []
            tags += [t for t in listed if isinstance(t, str)] if isinstance(listed, list) else []
            page = self._next_page(got)
        if page is not None:  # the newest may be among the tags not read: never guess
            raise self._fetcher.fail(
                f"the tag list of {self._ref.repository} goes on past the {_TAGS_PAGES} pages read to find its newest"
                f" version; name the version ({_FORMS})"
            )
        newest = newest_version(tags)
        if newest is None:
            raise self._fetcher.fail(f"no tag of {self._ref.repository} is a version; name one ({_FORMS})")
        return newest

    async def manifest(self, wanted: str) -> dict[str, Any]:
        """The manifest at ``wanted`` (a tag or a digest), an image's, not an index of them."""
        manifest, kind = await self.document(wanted)
        if kind in INDEXES:
            raise self._fetcher.fail(f"{self.name(wanted)} is an image index, not a Helm chart")
        return manifest

    async def document(self, wanted: str) -> tuple[dict[str, Any], str]:
        """What ``wanted`` (a tag or a digest) names, a manifest or an index, and its media type; a digest
        is checked against what the registry sends.
        """
        what = self.name(wanted)
        got = await self._get(
            self.url(f"manifests/{wanted}"), limit=MANIFEST_LIMIT, what=what, accept=", ".join(MANIFEST_TYPES)
        )
        if is_digest(wanted) and not matches(got.body, wanted):
            raise self._fetcher.fail(f"the registry's manifest does not match the digest {wanted}")
        manifest = _json(self._fetcher, got, "its manifest")
        kind = manifest.get("mediaType") or got.headers.get("Content-Type", "").split(";", 1)[0].strip()
        return manifest, str(kind)

    def name(self, wanted: str) -> str:
        """``<repository>:<tag>`` or ``<repository>@<digest>``, for messages."""
        return f"{self._ref.repository}{'@' if ':' in wanted else ':'}{wanted}"

    @property
    def authorization(self) -> dict[str, str]:
        """The headers that answer the registry's request for credentials, once it has asked (else none)."""
        return dict(self._authorization)

    async def blob(self, digest: str, size: int, max_size: int) -> bytes:
        got = await self._get(self.url(f"blobs/{digest}"), limit=max_size, what=f"the chart layer {digest}")
        if len(got.body) != size or not matches(got.body, digest):
            raise self._fetcher.fail(f"the chart layer the registry sent does not match its digest {digest}")
        return got.body

    def _next_page(self, got: Fetched) -> URL | None:
        """The next page of a tag list (``Link: <...>; rel="next"``), only on the registry itself."""
        match = _NEXT.search(got.headers.get("Link", ""))
        if match is None:
            return None
        following = got.url.join(URL(match[1]))
        return following if following.origin() == self._base.origin() else None

    def url(self, path: str) -> URL:
        """The repository's ``path`` (``manifests/<tag>``, ``blobs/<digest>``, ``tags/list?n=...``)."""
        return self._base.join(URL(path))

    async def fetch(self, url: URL, *, limit: int, accept: str | None = None) -> Fetched:
        """GET ``url``, answering the registry's request for credentials once; whatever the status.
        :class:`Unauthorized` when its token service refuses the credential.
        """
        headers = {"Accept": accept} if accept else {}
        got = await self._fetcher.get(url, limit=limit, headers={**headers, **self._authorization})
        if got.status == 401 and not self._challenged:
            self._challenged = True
            if await self._authorize(got):
                got = await self._fetcher.get(url, limit=limit, headers={**headers, **self._authorization})
        return got

    async def _get(self, url: URL, *, limit: int, what: str, accept: str | None = None) -> Fetched:
        try:
            got = await self.fetch(url, limit=limit, accept=accept)
        except TooLarge:
            raise self._fetcher.fail(f"{what} is larger than {limit} bytes") from None
        if got.status == 200:
            return got
        if got.status in (401, 403):
            raise Unauthorized(self._fetcher.fail(f"{got.status_text()} for {what}: check the registry credentials"))
        if got.status == 404:
            raise NotFound(
                str(self._fetcher.fail(f"{what} is not in the registry ({got.status_text()}{says(got.body)})"))
            )
        raise self._fetcher.fail(f"{got.status_text()} for {what}{says(got.body)}")

    async def _authorize(self, challenge: Fetched) -> bool:
        """Answer a 401's challenge: True when there is something new to send."""
        scheme, params = _challenge(challenge.headers.get("WWW-Authenticate", ""))
        if scheme == "basic":
            if self._credential is None:
                return False
            self._authorization = {"Authorization": basic_auth(self._credential)}
            return True
        if scheme != "bearer" or not params.get("realm"):
            return False
        realm = URL(params["realm"])
        query = dict(realm.query)
        if params.get("service"):
            query["service"] = params["service"]
        query["scope"] = params.get("scope") or f"repository:{self._ref.repository}:pull"
        headers = {"Authorization": basic_auth(self._credential)} if self._credential is not None else {}
        try:
            got = await self._fetcher.get(realm.with_query(query), limit=_TOKEN_LIMIT, headers=headers)
        except TooLarge:
            raise self._fetcher.fail("the registry's token service sent more than a token") from None
        if got.status in (401, 403):
            why = f"the registry's token service answered {got.status_text()}: check the registry credentials"
            raise Unauthorized(self._fetcher.fail(why))
        if got.status != 200:
            raise self._fetcher.fail(f"the registry's token service answered {got.status_text()}{says(got.body)}")
        answer = _json(self._fetcher, got, "its token")
        token = answer.get("token") or answer.get("access_token")
        if not isinstance(token, str) or not token or any(c.isspace() for c in token):
            raise self._fetcher.fail("the registry's token service sent no token")
        self._authorization = {"Authorization": f"Bearer {token}"}
        return True


def _challenge(header: str) -> tuple[str, dict[str, str]]:
    """The scheme (lowercase) and parameters of a ``WWW-Authenticate`` header's first challenge."""
    scheme, _, rest = header.strip().partition(" ")
    params = {
        m[1].lower(): (m[2].replace('\\"', '"') if m[3] is None else m[3]) for m in _CHALLENGE_PARAM.finditer(rest)
    }
    return scheme.lower(), params


def _chart_layer(fetcher: Fetcher, manifest: dict[str, Any]) -> tuple[str, int]:
    config = manifest.get("config")
    kind = config.get("mediaType") if isinstance(config, dict) else None
    if kind != HELM_CONFIG:
        shown = one_line(str(kind))[:100] if kind else "missing"
        raise fetcher.fail(f"it is not a Helm chart (its config's media type is {shown}, not {HELM_CONFIG})")
    layers = manifest.get("layers")
    for layer in layers if isinstance(layers, list) else []:
        if isinstance(layer, dict) and layer.get("mediaType") in CHART_LAYERS:
            digest, size = layer.get("digest"), layer.get("size")
            if not isinstance(digest, str) or not is_digest(digest):
                raise fetcher.fail("its chart layer has no valid digest")
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise fetcher.fail("its chart layer has no valid size")
            return digest, size
    raise fetcher.fail(f"its manifest has no chart layer ({CHART_LAYERS[0]})")


def is_digest(text: str) -> bool:
    """A sha256 or sha512 digest (``sha256:<64 hex>``)."""
    match = _DIGEST.fullmatch(text)
    return match is not None and len(match["hex"]) == _HEX_LENGTH[match["algorithm"]]


def matches(data: bytes, digest: str) -> bool:
    """Whether ``data`` has ``digest`` (``<algorithm>:<hex>``)."""
    algorithm, _, expected = digest.partition(":")
    return hashlib.new(algorithm, data).hexdigest() == expected


def _json(fetcher: Fetcher, got: Fetched, what: str) -> dict[str, Any]:
    try:
        value = json.loads(got.body)
    except (UnicodeDecodeError, ValueError):
        value = None
    if not isinstance(value, dict):
        raise fetcher.fail(f"the registry sent {what} as something other than a JSON object")
    return value


def says(body: bytes) -> str:
    """What a registry's error answer says (``{"errors": [{"message": ...}]}``), briefly, or nothing."""
    try:
        errors = json.loads(body).get("errors")
        message = errors[0]["message"]
    except (AttributeError, IndexError, KeyError, TypeError, ValueError):
        return ""
    return f": {one_line(message)[:200]}" if isinstance(message, str) and message else ""


def newest_version(tags: list[str]) -> str | None:
    """The tag of the newest semantic version (``_`` read as ``+``), releases before pre-releases."""
    releases: list[tuple[tuple[Any, ...], str]] = []
    previews: list[tuple[tuple[Any, ...], str]] = []
    for tag in tags:
        match = _SEMVER.fullmatch(tag.replace("_", "+"))
        if match is None:
            continue
        numbers = tuple(int(part or 0) for part in match.group(1, 2, 3))
        if match[4] is None:
            releases.append((numbers, tag))
        else:
            # Pre-release identifiers: numbers compare as numbers and below words (semver 2.0 §11).
            parts = tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in match[4].split("."))
            previews.append(((*numbers, parts), tag))
    chosen = releases or previews
    return max(chosen)[1] if chosen else None
