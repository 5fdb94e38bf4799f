"""Container/Helm registry credentials: recognized registries, the secret's format, and the lookup planes use."""

from __future__ import annotations

import base64
import binascii
import re

from nvcf_mono.auth.secret import Keyring
from nvcf_mono.contracts import pull_credentials
from nvcf_mono.models.secret import ArtifactType, RecognizedRegistry, StoredRegistryCredential
from nvcf_mono.planes.control.store import ControlStore

NGC_HOSTNAME = "nvcr.io"
NGC_USER = pull_credentials.NGC_USER
DOCKER_HUB = pull_credentials.DOCKER_HUB
#: Docker Hub's other names; image references without a registry mean Docker Hub too.
_DOCKER_HUB_ALIASES = (pull_credentials.DOCKER_HUB_NAMES - {DOCKER_HUB}) | {"registry.hub.docker.com"}

#: What NVCF recognises by host name; ``*.`` matches any subdomain.
RECOGNIZED = (
    RecognizedRegistry(name="Docker Hub", hostname=DOCKER_HUB),
    RecognizedRegistry(name="NGC", hostname=NGC_HOSTNAME),
    RecognizedRegistry(name="ECR", hostname="*.amazonaws.com"),
    RecognizedRegistry(name="ECR Public", hostname="public.ecr.aws"),
    RecognizedRegistry(name="Volcano Engine CR", hostname="cr.volces.com"),
    RecognizedRegistry(name="ACR", hostname="*.azurecr.io"),
)

_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
_HOSTNAME_RX = re.compile(rf"^{_LABEL}(?:\.{_LABEL})*(?::(?P<port>[0-9]{{1,5}}))?$")


def normalize_hostname(hostname: str) -> str:
    """Lower case, Docker Hub's aliases folded into ``docker.io``."""
    host = hostname.strip().lower()
    return DOCKER_HUB if host in _DOCKER_HUB_ALIASES else host


def hostname_problem(hostname: str) -> str | None:
    """Why ``hostname`` is not a registry host name (``host`` or ``host:port``), or None."""
    host = hostname.strip().lower()
    if "://" in host or "/" in host:
        return (
            f"registryHostname {hostname!r} must be a host name only (e.g. nvcr.io or registry.example.com:5000), "
            "without scheme or path"
        )
    m = _HOSTNAME_RX.match(host)
    if m is None:
        return f"registryHostname {hostname!r} is not a valid host name"
    if m["port"] is not None and not 1 <= int(m["port"]) <= 65535:
        return f"registryHostname {hostname!r}: the port must be between 1 and 65535"
    return None


def _matches(pattern: str, host: str) -> bool:
    name = host.split(":", 1)[0]
    if pattern.startswith("*."):
        return name.endswith(pattern[1:])
    return name == pattern or name.endswith("." + pattern)


def registry_name(hostname: str) -> str:
    """The recognized registry's name for a host (``nvcr.io`` -> ``NGC``), else the host itself."""
    host = normalize_hostname(hostname)
    for registry in RECOGNIZED:
        if _matches(registry.hostname, host):
            return registry.name
    return host


def decode_basic(value: str) -> tuple[str, str]:
    """``base64('user:password')`` -> ``(user, password)``; ValueError says what is wrong."""
    try:
        text = base64.b64decode(value.strip(), validate=True).decode()
    except (binascii.Error, ValueError):
        raise ValueError("it is not base64 text") from None
    user, sep, password = text.partition(":")
    if not sep or not user or not password:
        raise ValueError("it does not decode to '<username>:<password>'")
    return user, password


def secret_problem(hostname: str, value: str) -> str | None:
    """Why a credential's secret value is unusable for ``hostname``, with a hint; None when fine."""
    ngc = normalize_hostname(hostname) == NGC_HOSTNAME
    example = f"base64 of '{NGC_USER}:<NGC API key>'" if ngc else "base64 of '<username>:<password>'"
    try:
        user, _ = decode_basic(value)
    except ValueError as err:
        return f"secret.value must be {example} (e.g. `echo -n '<username>:<password>' | base64`): {err}"
    if ngc and user != NGC_USER:
        return f"secret.value for NGC (nvcr.io) must use the username '{NGC_USER}': {example}"
    return None


def find_credential(
    store: ControlStore, nca_id: str, hostname: str, artifact_type: ArtifactType | None = None
) -> tuple[str, StoredRegistryCredential] | None:
    """The account's credential for a host (and artifact type): ``(key, stored)``, or None."""
    host = normalize_hostname(hostname)
    for key, stored in store.registry_credentials.items():
        cred = stored.credential
        if cred.nca_id != nca_id or normalize_hostname(cred.registry_hostname) != host:
            continue
        if artifact_type is None or artifact_type in cred.artifact_types:
            return key, stored
    return None


def credentials_for(
    store: ControlStore, keyring: Keyring, nca_id: str, hostname: str, artifact_type: ArtifactType
) -> tuple[str, str] | None:
    """The ``(user, password)`` an account stored for pulling ``artifact_type`` from ``hostname``, or None."""
    found = find_credential(store, nca_id, hostname, artifact_type)
    if found is None:
        return None
    key, stored = found
    value = keyring.box.open(stored.sealed_secret, aad=key).decode()
    return decode_basic(value)


def pull_credentials_for(store: ControlStore, keyring: Keyring, nca_id: str, image: str | None) -> str | None:
    """``CONTAINER_REGISTRIES_CREDENTIALS`` for an instance of ``image``: the account's CONTAINER credential for
    the image's registry, or None (a public image, or nothing stored).
    """
    if not image:
        return None
    host = pull_credentials.image_registry(image)
    try:
        found = credentials_for(store, keyring, nca_id, host, ArtifactType.CONTAINER)
    except ValueError:  # a stored secret that does not decode: pulling goes without it, and says why
        return None
    return pull_credentials.encode(host, *found) if found is not None else None


def all_pull_credentials(store: ControlStore, keyring: Keyring, nca_id: str) -> str | None:
    """Every CONTAINER credential of the account: a Helm chart's images may come from any of them."""
    found: dict[str, tuple[str, str]] = {}
    for key, stored in store.registry_credentials.items():
        cred = stored.credential
        if cred.nca_id != nca_id or ArtifactType.CONTAINER not in cred.artifact_types:
            continue
        try:
            found[normalize_hostname(cred.registry_hostname)] = decode_basic(
                keyring.box.open(stored.sealed_secret, aad=key).decode()
            )
        except ValueError:
            continue
    return pull_credentials.encode_all(found) if found else None


def chart_credentials_for(store: ControlStore, keyring: Keyring, nca_id: str, chart: str | None) -> str | None:
    """``HELM_REGISTRIES_CREDENTIALS``: the account's HELM credential for the chart's host, or None."""
    if not chart or "://" not in chart:
        return None
    host = chart.split("://", 1)[1].split("/", 1)[0].lower()
    try:
        found = credentials_for(store, keyring, nca_id, host, ArtifactType.HELM)
    except ValueError:
        return None
    return pull_credentials.encode(host, *found) if found is not None else None
