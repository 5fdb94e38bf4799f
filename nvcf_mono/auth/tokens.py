"""Signed, self-contained tokens the platform issues to itself (worker tokens, upload links).

``nvcft_<base64url JSON claims>.<base64url HMAC-SHA256>``: verifiable on any node holding the
platform secret, without a lookup. Claims carry a kind, so a token of one kind never passes as another.
"""

from __future__ import annotations

import hmac
import json
import time
from collections.abc import Mapping
from typing import Any, final

from nvcf_mono.auth.secret import b64u, unb64u
from nvcf_mono.errors import NvcfMonoError

PREFIX = "nvcft_"


class InvalidToken(NvcfMonoError):
    """The token is malformed, of another kind, forged or expired."""


class OtherKind(InvalidToken):
    """A valid platform token, of another kind than the one asked for."""


@final
class TokenSigner:
    """Mints and checks tokens with one key."""

    def __init__(self, key: bytes) -> None:
        self._key = key

    def mint(self, kind: str, claims: Mapping[str, Any], *, ttl: float | None = None) -> str:
        body: dict[str, Any] = {"k": kind, "iat": int(time.time()), **claims}
        if ttl is not None:
            body["exp"] = int(time.time() + ttl)
        payload = b64u(json.dumps(body, separators=(",", ":"), sort_keys=True).encode())
        return f"{PREFIX}{payload}.{self._sign(payload)}"

    def verify(self, token: str, kind: str) -> dict[str, Any]:
        """The claims of a valid token of ``kind``; raises :class:`InvalidToken`."""
        if not token.startswith(PREFIX) or token.count(".") != 1:
            raise InvalidToken("not a platform token")
        payload, sig = token[len(PREFIX) :].split(".")
        if not hmac.compare_digest(sig, self._sign(payload)):
            raise InvalidToken("the token signature does not match (forged, or another platform secret)")
        try:
            claims = json.loads(unb64u(payload))
        except ValueError as err:
            raise InvalidToken("the token payload is not JSON") from err
        if not isinstance(claims, dict):
            raise InvalidToken("the token payload is not an object")
        if claims.get("k") != kind:
            raise OtherKind(f"not a {kind} token")
        exp = claims.get("exp")
        if isinstance(exp, int) and exp < time.time():
            raise InvalidToken("the token has expired")
        return claims

    def _sign(self, payload: str) -> str:
        return b64u(hmac.digest(self._key, payload.encode(), "sha256"))


WORKER = "worker"


def mint_worker_token(
    signer: TokenSigner,
    *,
    nca_id: str,
    function_id: str,
    function_version_id: str,
    request_id: str,
    task_id: str | None = None,
) -> str:
    """The per-instance token a worker presents to ConnectOnce and the secrets fetch."""
    claims = {"nca": nca_id, "fid": function_id, "fvid": function_version_id, "rid": request_id}
    if task_id is not None:
        claims["tid"] = task_id
    return signer.mint(WORKER, claims)
