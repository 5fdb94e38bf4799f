"""Delegation tokens: a short-lived credential that may invoke a few functions, handed to a client.

``POST /v2/nvcf/tokens/functions`` mints one for the caller's account (NVCF's function delegation
tokens). It is a platform token (:mod:`.tokens`) of kind ``delegation`` naming the account, the client
it was given to (the caller the function sees), the functions, and, when an API key minted it, that
key's id and a fingerprint of its authorizations. Any node checks it without a lookup, except that a
token an API key minted dies with the key: revoked, expired or suspended, or its authorizations
changed since (so narrowing a key also withdraws what it handed out).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from typing import final

from nvcf_mono.auth.keystore import ApiKeyStore, effective_status
from nvcf_mono.auth.principal import AuthError, Principal, Resources
from nvcf_mono.auth.scopes import INVOKE_FUNCTION
from nvcf_mono.auth.secret import Keyring, b64u
from nvcf_mono.auth.tokens import PREFIX, InvalidToken, OtherKind, TokenSigner
from nvcf_mono.late import Late
from nvcf_mono.models.api_key import ApiKeyRecord, KeyStatus
from nvcf_mono.models.common import parse_iso
from nvcf_mono.services import ServiceKey

#: The token kind, and the kind of the principal it makes.
KIND = "delegation"
#: Functions one token may name (NVCF's limit).
MAX_FUNCTIONS = 4
#: The only scope a delegation token carries.
SCOPES = frozenset({INVOKE_FUNCTION})


def fingerprint(record: ApiKeyRecord) -> str:
    """A short digest of a key's authorizations (their repr: tuples, enums and strings, stable)."""
    return b64u(hashlib.blake2b(repr(record.authorizations).encode(), digest_size=12).digest())


@final
class DelegationTokens:
    """Mints delegation tokens and, as an auth strategy, claims them (other platform tokens are left be)."""

    name = "delegation"

    def __init__(self, *, lifetime: float) -> None:
        #: Seconds a token is valid for (less when the minting key expires sooner).
        self.lifetime = lifetime
        self._signer: Late[TokenSigner] = Late("delegation tokens")
        self._keys: ApiKeyStore | None = None

    def bind(self, keyring: Keyring, keys: ApiKeyStore | None) -> None:
        """The token key (known once the auth plugin runs), and the API keys when this node has them."""
        self._signer.set(TokenSigner(keyring.token_key))
        self._keys = keys

    def mint(
        self,
        principal: Principal,
        *,
        client_id: str,
        functions: Sequence[tuple[str, str | None]],
        key: ApiKeyRecord | None,
    ) -> tuple[str, int]:
        """A token for ``client_id`` to invoke ``functions`` (``(fid, vid)``; vid None: every version), and
        the seconds it is valid for.
        """
        ttl = int(self.lifetime)
        claims: dict[str, object] = {
            "nca": principal.account,
            "sub": client_id,
            "by": principal.subject,
            "fn": [f"{fid}/{vid or '*'}" for fid, vid in functions],
        }
        if key is not None:
            claims["key"] = key.id
            claims["kf"] = fingerprint(key)
            ttl = max(0, min(ttl, int(parse_iso(key.expires_at).timestamp() - time.time())))
        return self._signer.get().mint(KIND, claims, ttl=ttl), ttl

    async def authenticate(self, token: str) -> Principal | None:
        if not token.startswith(PREFIX):
            return None
        try:
            claims = self._signer.get().verify(token, KIND)
        except OtherKind:
            return None
        except InvalidToken as err:
            raise AuthError(401, f"invalid delegation token: {err}") from None
        account, client, functions = claims.get("nca"), claims.get("sub"), claims.get("fn")
        if not isinstance(account, str) or not isinstance(client, str) or not isinstance(functions, list):
            raise AuthError(401, "invalid delegation token: its claims are incomplete")
        pairs: set[tuple[str, str]] = set()
        for entry in functions:
            fid, slash, vid = str(entry).partition("/")
            if fid and slash and vid:
                pairs.add((fid, vid))
        key_id = claims.get("key")
        if key_id is not None:
            self._check_key(str(key_id), claims.get("kf"))
        return Principal(
            kind=KIND,
            subject=client,
            account=account,
            scopes=SCOPES,
            resources=Resources(functions=frozenset(pairs)),
            key_id=None if key_id is None else str(key_id),
        )

    def _check_key(self, key_id: str, expected: object) -> None:
        """The API key that minted the token is still active, with the authorizations it had then."""
        if self._keys is None:
            raise AuthError(401, "the delegation token was minted by an API key, and this node has no API keys")
        record = self._keys.find(key_id)
        if record is None:
            raise AuthError(401, "the API key that minted this delegation token has been revoked")
        status = effective_status(record)
        if status is not KeyStatus.ACTIVE:
            raise AuthError(401, f"the API key that minted this delegation token is {status.value.lower()}")
        if fingerprint(record) != expected:
            raise AuthError(401, "the authorizations of the API key that minted this delegation token changed since")


#: Provided by the ``auth_delegation`` plugin.
DELEGATION_TOKENS: ServiceKey[DelegationTokens] = ServiceKey("nvcf_mono.auth.delegation")
