"""Where a chart comes from: a local directory or archive, an OCI registry, or an https URL."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

import attrs

from nvcf_mono.helm.errors import HelmRenderError
from nvcf_mono.helm.model import RegistryCredential

SourceKind = Literal["directory", "archive", "oci", "https"]

_FORMS = "a chart directory, a .tgz archive, an oci:// reference or an https:// URL of a .tgz"


@attrs.frozen(kw_only=True)
class ChartSource:
    """A chart reference, classified; local paths are known to exist."""

    kind: SourceKind
    ref: str
    host: str | None = None

    @property
    def path(self) -> Path:
        """The local directory or archive."""
        return Path(self.ref)

    @property
    def display(self) -> str:
        """The reference without any password in it, for messages."""
        return redact(self.ref)

    def credentials(self, credentials: Mapping[str, tuple[RegistryCredential, ...]]) -> tuple[RegistryCredential, ...]:
        """The credentials configured for this chart's host, in order."""
        return () if self.host is None else credentials.get(self.host, ())


def redact(ref: str) -> str:
    """``ref`` with the userinfo of a URL removed."""
    if "://" not in ref:
        return ref
    parts = urlsplit(ref)
    if "@" not in parts.netloc:
        return ref
    return parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]).geturl()


def chart_source(ref: str) -> ChartSource:
    """Classify ``ref``; raises :class:`HelmRenderError` for a missing path or an unsupported reference."""
    if not ref.strip():
        raise HelmRenderError(f"no chart given: name {_FORMS}")
    scheme, sep, _ = ref.partition("://")
    if sep:
        if scheme.lower() not in ("oci", "https"):
            raise HelmRenderError(f"unsupported chart reference {redact(ref)!r}: give {_FORMS}")
        host = urlsplit(ref).netloc.rsplit("@", 1)[-1].lower()
        if not host:
            raise HelmRenderError(f"chart reference {redact(ref)!r} has no host")
        return ChartSource(kind="oci" if scheme.lower() == "oci" else "https", ref=ref, host=host)
    path = Path(ref).expanduser()
    if path.is_dir():
        if not (path / "Chart.yaml").is_file():
            raise HelmRenderError(f"{ref} is not a chart: the directory has no Chart.yaml")
        return ChartSource(kind="directory", ref=str(path))
    if path.is_file():
        return ChartSource(kind="archive", ref=str(path))
    raise HelmRenderError(f"chart not found: {ref} does not exist (give {_FORMS})")
