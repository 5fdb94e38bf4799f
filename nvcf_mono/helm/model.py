"""What a render is asked for and what it returns."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from nvcf_mono.helm.errors import HelmRenderError

# Helm's own rules: a release name is a DNS-1123 subdomain of at most 53 characters (it prefixes object
# names), a namespace a DNS-1123 label.
_RELEASE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


@attrs.frozen
class RegistryCredential:
    """A username and password for one registry or chart host."""

    username: str
    password: str = attrs.field(repr=False)


def _attempts(
    given: Mapping[str, RegistryCredential | Sequence[RegistryCredential]],
) -> dict[str, tuple[RegistryCredential, ...]]:
    return {host: (c,) if isinstance(c, RegistryCredential) else tuple(c) for host, c in given.items()}


@attrs.frozen(kw_only=True)
class RenderRequest:
    """One chart to render.

    ``chart`` is a chart directory, a ``.tgz`` archive, an ``oci://host/path/name[:tag]`` reference or an
    ``https://`` URL of a ``.tgz``. ``credentials`` maps a host (``host`` or ``host:port``, as in the
    reference) to the credentials to fetch the chart from it with, tried in order and then none (one
    credential alone is one to try).
    """

    chart: str
    values: Mapping[str, Any] = attrs.field(factory=dict)
    release: str = "release"
    namespace: str = "default"
    credentials: Mapping[str, tuple[RegistryCredential, ...]] = attrs.field(
        factory=dict, repr=False, converter=_attempts
    )

    def check(self) -> None:
        """Raise :class:`HelmRenderError` for a release name or namespace Kubernetes would refuse."""
        if len(self.release) > 53 or not _RELEASE.fullmatch(self.release):
            raise HelmRenderError(
                f"invalid release name {self.release!r}: at most 53 lower-case letters, digits, '-' and '.', "
                "starting and ending with a letter or digit"
            )
        if len(self.namespace) > 63 or not _NAMESPACE.fullmatch(self.namespace):
            raise HelmRenderError(
                f"invalid namespace {self.namespace!r}: at most 63 lower-case letters, digits and '-', "
                "starting and ending with a letter or digit"
            )
        if not isinstance(self.values, Mapping):
            raise HelmRenderError(f"values must be a mapping, got {type(self.values).__name__}")


@attrs.frozen(kw_only=True)
class SkippedObject:
    """Something the chart renders that is never installed, and why."""

    source: str
    kind: str | None
    name: str | None
    reason: str

    def __str__(self) -> str:
        what = "/".join(part for part in (self.kind, self.name) if part) or "a document"
        return f"{what} ({self.source}): {self.reason}"


@attrs.frozen(kw_only=True)
class RenderedChart:
    """The Kubernetes objects a chart renders to, in Helm's install order, and what was left out."""

    chart_name: str
    chart_version: str
    objects: tuple[dict[str, Any], ...]
    skipped: tuple[SkippedObject, ...]
    renderer: str


@attrs.frozen(kw_only=True)
class RendererOptions:
    """How renderers fetch and render; every renderer reads what applies to it."""

    #: The helm executable; default: ``helm`` on the ``PATH`` of ``environ``.
    binary: Path | None = None
    #: Environment of the helm subprocess (and its ``PATH`` for finding it); default: this process's.
    environ: Mapping[str, str] | None = None
    #: Deadline of one render, fetching the chart included.
    timeout: float = 60.0
    #: Largest chart archive fetched from an https URL or an OCI registry.
    max_chart_size: int = 20 * 1024 * 1024
    #: A CA bundle trusted (besides the system's) for charts fetched over https (URLs, OCI registries).
    ca_file: Path | None = None
    #: A tenant's chart: fetched only from public addresses and these networks (CIDR); None: unchecked
    #: (the operator's own renders, ``nvcf-mono helm``).
    chart_networks: tuple[str, ...] | None = None
    #: OCI registries (``host[:port]``) charts are pulled from, and images checked in, over plain http.
    plain_http: tuple[str, ...] = ()
