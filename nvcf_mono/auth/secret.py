"""The platform secret: one file from which every node derives the same keys.

API-key hashing, secret encryption, worker tokens and the bootstrap admin token all come from it,
so a key minted on one control-plane node works on every invocation node. All-in-one generates it
in the state directory; split roles must be given the same file (start fails without it).
"""

from __future__ import annotations

import base64
import hmac
import os
import secrets
import typing
from pathlib import Path
from typing import Any, final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from nvcf_mono.errors import NvcfMonoError
from nvcf_mono.services import ServiceKey
from nvcf_mono.state_dir import write_private

SECRET_BYTES = 64
FILE_HEADER = "# nvcf-mono platform secret: keep it private and identical on every node\n"


class SecretFileError(NvcfMonoError):
    """The platform secret file is missing or malformed."""


class DecryptError(NvcfMonoError):
    """A ciphertext does not open with this key (another platform secret, or tampered)."""


def b64u(data: bytes) -> str:
    """base64url without padding."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unb64u(text: str) -> bytes:
    """Inverse of :func:`b64u` (padding optional)."""
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@final
class SecretBox:
    """AES-256-GCM with a random nonce; ``aad`` binds a ciphertext to what it belongs to."""

    def __init__(self, key: bytes) -> None:
        self._aead = AESGCM(key)

    def seal(self, plaintext: bytes, *, aad: str) -> str:
        nonce = os.urandom(12)
        return b64u(nonce + self._aead.encrypt(nonce, plaintext, aad.encode()))

    def open(self, sealed: str, *, aad: str) -> bytes:
        try:
            raw = unb64u(sealed)
            return self._aead.decrypt(raw[:12], raw[12:], aad.encode())
        except (InvalidTag, ValueError) as err:
            raise DecryptError("cannot decrypt: the value was sealed with another platform secret or changed") from err


@final
class PlatformSecret:
    """Derives purpose-bound keys from the platform secret (HKDF-SHA256, one label per purpose)."""

    def __init__(self, raw: bytes) -> None:
        if len(raw) < 32:
            raise SecretFileError("the platform secret must hold at least 32 bytes")
        self._raw = raw

    @classmethod
    def generate(cls) -> PlatformSecret:
        return cls(secrets.token_bytes(SECRET_BYTES))

    @classmethod
    def load(cls, path: Path) -> PlatformSecret:
        """Read a file written by :meth:`write`."""
        try:
            lines = [ln.strip() for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
        except OSError as err:
            raise SecretFileError(f"cannot read the platform secret {path}: {err.strerror or err}") from err
        if len(lines) != 1:
            raise SecretFileError(f"{path}: expected one line of base64url text")
        try:
            raw = unb64u(lines[0])
        except ValueError as err:
            raise SecretFileError(f"{path}: not base64url text") from err
        return cls(raw)

    @classmethod
    def load_or_create(cls, path: Path) -> PlatformSecret:
        """Load the file, creating it (mode 0600) first if it does not exist."""
        if not path.exists():
            cls.generate().write(path)
        return cls.load(path)

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_private(path, (FILE_HEADER + b64u(self._raw) + "\n").encode())

    def derive(self, label: str, length: int = 32) -> bytes:
        """A key for one purpose; the same label always gives the same key."""
        hkdf = HKDF(algorithm=hashes.SHA256(), length=length, salt=b"nvcf-mono", info=label.encode())
        return hkdf.derive(self._raw)

    def fingerprint(self) -> str:
        """A short public identifier, to tell two nodes' secrets apart in logs."""
        return b64u(hmac.digest(self.derive("fingerprint"), b"nvcf-mono", "sha256"))[:12]

    def secret_box(self) -> SecretBox:
        """Encrypts function and task secrets and registry credentials at rest."""
        return SecretBox(self.derive("secret-encryption/v1"))

    def api_key_domain_key(self) -> bytes:
        """The HMAC-SHA3-256 key API-key hashes use (136 bytes, as NVCF's data-domain key)."""
        return self.derive("api-key-hash/v1", 136)

    def admin_token(self) -> str:
        """The bootstrap admin token every node with this secret recognises."""
        return "nvcf-admin-" + b64u(self.derive("admin-token/v1", 32))


@final
class Keyring:
    """The platform secret once the ``auth`` plugin has loaded it, and the keys derived from it."""

    def __init__(self) -> None:
        self._secret: PlatformSecret | None = None
        self._box: SecretBox | None = None
        self._domain_key: bytes | None = None
        self._admin_token: str | None = None
        self._token_key: bytes | None = None
        self._asset_link_key: bytes | None = None

    def load(self, secret: PlatformSecret) -> None:
        self._secret = secret
        self._box = secret.secret_box()
        self._domain_key = secret.api_key_domain_key()
        self._admin_token = secret.admin_token()
        self._token_key = secret.derive("platform-tokens/v1")
        self._asset_link_key = secret.derive("asset-links/v1")

    @property
    def loaded(self) -> bool:
        return self._secret is not None

    def _need(self, value: Any) -> Any:
        if value is None:
            raise SecretFileError("the platform secret is not loaded yet (is the 'auth' plugin enabled?)")
        return value

    @property
    def secret(self) -> PlatformSecret:
        return typing.cast(PlatformSecret, self._need(self._secret))

    @property
    def box(self) -> SecretBox:
        return typing.cast(SecretBox, self._need(self._box))

    @property
    def api_key_domain_key(self) -> bytes:
        return typing.cast(bytes, self._need(self._domain_key))

    @property
    def admin_token(self) -> str:
        return typing.cast(str, self._need(self._admin_token))

    @property
    def token_key(self) -> bytes:
        return typing.cast(bytes, self._need(self._token_key))

    @property
    def asset_link_key(self) -> bytes:
        """Signs the upload and download links of assets."""
        return typing.cast(bytes, self._need(self._asset_link_key))


#: Provided by the ``auth`` plugin; loaded when it starts (planes that need it require ``auth``).
KEYRING: ServiceKey[Keyring] = ServiceKey("nvcf_mono.auth.keyring")
