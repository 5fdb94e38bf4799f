"""``CONTAINER_REGISTRIES_CREDENTIALS``: the account's registry credentials for an instance's image, as the
control plane sends them and a cluster agent turns them into a pull secret (reference compute-plane §1:
base64 of ``{k8sSecrets: [{auths: {<host>: {auth}}}]}``, ``auth`` being base64 of ``user:password``).
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

DOCKER_HUB = "docker.io"
#: Docker Hub by the names an image reference may give it.
DOCKER_HUB_NAMES = frozenset({DOCKER_HUB, "index.docker.io", "registry-1.docker.io"})
#: NGC's user name for an API key (nvcr.io, and NVCF's legacy ``apiKey``).
NGC_USER = "$oauthtoken"


def image_registry(image: str) -> str:
    """The registry host of an image reference (``nvcr.io/org/x:1`` -> ``nvcr.io``; ``ubuntu`` -> ``docker.io``)."""
    return split_image(image)[0]


def split_image(image: str) -> tuple[str, str]:
    """An image reference's registry host (lower case, Docker Hub by any of its names as ``docker.io``) and
    the rest of it: the first part names a registry when it has a ``.`` or a ``:`` or is ``localhost``.
    """
    text = image.strip()
    first, sep, rest = text.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return registry_host(first), rest
    return DOCKER_HUB, text


def encode(host: str, user: str, password: str) -> str:
    """The contract value carrying one registry's credentials."""
    return encode_all({host: (user, password)})


def encode_all(credentials: dict[str, tuple[str, str]]) -> str:
    """The contract value carrying several registries' credentials (host -> (user, password))."""
    auths = {h: {"auth": base64.b64encode(f"{u}:{p}".encode()).decode()} for h, (u, p) in credentials.items()}
    doc = {"k8sSecrets": [{"auths": auths}]}
    return base64.b64encode(json.dumps(doc, sort_keys=True).encode()).decode()


def decode(value: str) -> dict[str, Any]:
    """The document a contract value carries (``{k8sSecrets: [...]}``); {} when unreadable."""
    try:
        doc = json.loads(base64.b64decode(value.strip(), validate=True))
    except (ValueError, TypeError, binascii.Error):
        return {}
    return doc if isinstance(doc, dict) else {}


def auths_in(doc: Any, host: str | None) -> dict[str, Any]:
    """The ``auths`` entries of a decoded document for ``host`` (every host when None); {} when malformed."""
    try:
        return {
            h: entry
            for secret in doc.get("k8sSecrets") or []
            for h, entry in ((secret or {}).get("auths") or {}).items()
            if host is None or h.lower().removeprefix("https://").rstrip("/") == host
        }
    except (TypeError, AttributeError):
        return {}


def auths_for(value: str, host: str | None) -> dict[str, Any]:
    """The ``auths`` entries of a contract value for ``host`` (every host when None): a docker config's."""
    return auths_in(decode(value), host)


def basic(entry: Any) -> tuple[str, str] | None:
    """``(user, password)`` of one ``auths`` entry (``auth``: base64 of ``user:password``), or None."""
    try:
        user, _, password = base64.b64decode(str(entry.get("auth", ""))).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError, ValueError, AttributeError):
        return None
    return (user, password) if user and password else None


def registry_host(key: str) -> str:
    """The registry an ``auths`` key names (``https://index.docker.io/v1/`` -> ``docker.io``): lower case,
    without scheme or path, Docker Hub by any of its names as ``docker.io``.
    """
    host = key.strip().lower().removeprefix("https://").removeprefix("http://").split("/", 1)[0]
    return DOCKER_HUB if host in DOCKER_HUB_NAMES else host


def logins_for(value: str, host: str) -> list[tuple[str, str]]:
    """Every ``(user, password)`` a contract value holds for registry ``host`` (as :func:`image_registry`
    gives it), in order; none for an empty or unreadable value.
    """
    found: list[tuple[str, str]] = []
    for name, entry in auths_for(value, None).items():
        login = basic(entry)
        if login and login not in found and registry_host(name) == host:
            found.append(login)
    return found
