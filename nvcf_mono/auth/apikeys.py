"""NVCF's API-key format: ``nvapi-`` + 43-char base64url secret + the first 21 chars of its hash.

The hash is base64url(HMAC-SHA3-256(domain key, secret)); only the hash is stored, so a leaked
store reveals no key (reference auth §4.1, with its test vector in the tests).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets

from nvcf_mono.auth.secret import b64u, unb64u
from nvcf_mono.errors import NvcfMonoError

KEY_PREFIX = "nvapi-"
_BODY = r"(?P<body>[A-Za-z0-9_-]{43})(?P<hashprefix>[A-Za-z0-9_-]{21})"


class KeyFormatError(NvcfMonoError):
    """The text is not an API key of this platform (or its check characters are wrong)."""


def key_hash(domain_key: bytes, secret: bytes) -> str:
    """base64url-nopad of HMAC-SHA3-256: 43 characters."""
    return b64u(hmac.new(domain_key, secret, hashlib.sha3_256).digest())


def generate(domain_key: bytes, *, prefix: str = KEY_PREFIX) -> tuple[str, str]:
    """A new key: ``(the key to hand out, the hash to store)``."""
    secret = secrets.token_bytes(32)
    digest = key_hash(domain_key, secret)
    return f"{prefix}{b64u(secret)}{digest[:21]}", digest


def parse(key: str, domain_key: bytes, *, prefix: str = KEY_PREFIX) -> str:
    """The stored hash of a presented key; raises :class:`KeyFormatError` as NVCF does."""
    if not key:
        raise KeyFormatError("api key empty")
    m = re.fullmatch(re.escape(prefix) + _BODY, key)
    if m is None:
        raise KeyFormatError("api key format invalid")
    digest = key_hash(domain_key, unb64u(m["body"]))
    if not digest.startswith(m["hashprefix"]):
        raise KeyFormatError("Invalid key")
    return digest


def masked(prefix: str, digest: str) -> str:
    """What listings show of a key: ``nvapi-**********abc``."""
    return f"{prefix}**********{digest[18:21]}"
