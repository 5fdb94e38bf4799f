"""NATS auth callout, the protocol: read the server's authorization request, sign its answer.

With ``auth_callout`` in its configuration, nats-server sends every connection not in
``auth_users`` to ``$SYS.REQ.USER.AUTH`` as a JWT (an *authorization request*: the connection's
one-time ``user_nkey``, its connect options, the server id); the answer is an *authorization
response* JWT carrying a *user* JWT (the permissions that connection gets), both signed by the
issuer account key the server trusts. JWTs here are NATS's own: header ``ed25519-nkey``, an
Ed25519 signature by an nkey (https://docs.nats.io/running-a-nats-service/configuration/securing_nats/auth_callout).
"""

from __future__ import annotations

import base64
import hashlib
import json
import time
from typing import Any, final

import attrs
import nacl.exceptions
import nacl.signing
import nkeys

from nvcf_mono.errors import NvcfMonoError
from nvcf_mono.services import ServiceKey

CALLOUT_SUBJECT = "$SYS.REQ.USER.AUTH"
#: The account of a configuration-mode server without accounts.
GLOBAL_ACCOUNT = "$G"


class CalloutError(NvcfMonoError):
    """An authorization request that cannot be read (or was not signed by a server)."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@final
class Issuer:
    """The account key that signs user JWTs (the server's ``auth_callout.issuer``)."""

    def __init__(self, seed: bytes) -> None:
        if len(seed) < 32:
            raise ValueError("an issuer needs 32 bytes of seed material")
        self._signing = nacl.signing.SigningKey(seed[:32])
        encoded = nkeys.encode_seed(seed[:32], nkeys.PREFIX_BYTE_ACCOUNT)  # type: ignore[no-untyped-call]
        self.public_key: str = nkeys.from_seed(encoded).public_key.decode()  # type: ignore[no-untyped-call]
        self.seed: str = encoded.decode()

    def sign(self, data: bytes) -> bytes:
        return bytes(self._signing.sign(data).signature)


def encode_jwt(claims: dict[str, Any], signer: Issuer) -> str:
    """A NATS JWT: ``jti`` and ``iat`` filled in, signed with ``signer``."""
    body = dict(claims)
    body.setdefault("iat", int(time.time()))
    body["jti"] = ""
    digest = hashlib.sha512(json.dumps(body, separators=(",", ":"), sort_keys=True).encode()).digest()[:32]
    body["jti"] = base64.b32encode(digest).decode().rstrip("=")
    header = _b64(json.dumps({"typ": "JWT", "alg": "ed25519-nkey"}, separators=(",", ":")).encode())
    payload = _b64(json.dumps(body, separators=(",", ":")).encode())
    signature = signer.sign(f"{header}.{payload}".encode())
    return f"{header}.{payload}.{_b64(signature)}"


def _verify_key(public: str) -> nacl.signing.VerifyKey:
    """The Ed25519 key inside a public nkey (base32: prefix byte, 32 key bytes, CRC16)."""
    raw = base64.b32decode(public + "=" * (-len(public) % 8))
    if len(raw) != 35:
        raise ValueError(f"{public[:8]}... is not a public nkey")
    return nacl.signing.VerifyKey(raw[1:33])


def decode_jwt(token: str, *, issuer_prefix: str | None = None) -> dict[str, Any]:
    """The claims of a NATS JWT, with its signature checked against its own issuer (``iss``)."""
    try:
        header, payload, signature = token.split(".")
        claims: dict[str, Any] = json.loads(_unb64(payload))
        issuer = str(claims["iss"])
        if issuer_prefix is not None and not issuer.startswith(issuer_prefix):
            raise ValueError(f"issued by {issuer[:1]}... where {issuer_prefix}... was expected")
        _verify_key(issuer).verify(f"{header}.{payload}".encode(), _unb64(signature))
    except (ValueError, KeyError, TypeError, nacl.exceptions.BadSignatureError) as err:
        raise CalloutError(f"not a valid NATS JWT: {err}") from err
    return claims


@final
@attrs.frozen(kw_only=True)
class AuthorizationRequest:
    """What the server asks about one connection."""

    user_nkey: str
    server_id: str
    token: str
    user: str
    client_name: str
    client_host: str

    @classmethod
    def decode(cls, token: str) -> AuthorizationRequest:
        claims = decode_jwt(token, issuer_prefix="N")  # signed by a server key
        nats = claims.get("nats", {})
        if nats.get("type") != "authorization_request":
            raise CalloutError("the JWT is not an authorization request")
        server = nats.get("server_id", {})
        opts = nats.get("connect_opts", {})
        client = nats.get("client_info", {})
        return cls(
            user_nkey=str(nats.get("user_nkey", "")),
            server_id=str(server.get("id", "")),
            token=str(opts.get("auth_token", "")),
            user=str(opts.get("user", "")),
            client_name=str(client.get("name", "")),
            client_host=str(client.get("host", "")),
        )


@final
@attrs.frozen(kw_only=True)
class Grant:
    """What a connection may do."""

    name: str
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    #: The connection may answer this many replies per request it receives (0: none).
    max_responses: int = 0
    expires_in: float | None = None


def authorization_response(
    request: AuthorizationRequest,
    issuer: Issuer,
    *,
    grant: Grant | None = None,
    error: str | None = None,
    account: str = GLOBAL_ACCOUNT,
) -> bytes:
    """The signed answer: a user JWT for ``grant``, or the ``error`` that refuses the connection."""
    issuer_key = issuer.public_key
    nats: dict[str, Any] = {"type": "authorization_response", "version": 2}
    if grant is not None:
        user: dict[str, Any] = {
            "sub": request.user_nkey,
            "aud": account,
            "iss": issuer_key,
            "name": grant.name,
            "nats": {
                "pub": {"allow": list(grant.publish)},
                "sub": {"allow": list(grant.subscribe)},
                "subs": -1,
                "data": -1,
                "payload": -1,
                "type": "user",
                "version": 2,
            },
        }
        if grant.max_responses:
            user["nats"]["resp"] = {"max": grant.max_responses, "ttl": 0}
        if grant.expires_in is not None:
            user["exp"] = int(time.time() + grant.expires_in)
        nats["jwt"] = encode_jwt(user, issuer)
    else:
        nats["error"] = error or "not authorized"
    response = {"sub": request.user_nkey, "aud": request.server_id, "iss": issuer_key, "nats": nats}
    return encode_jwt(response, issuer).encode()


def envelope(account: str, plugin: str, payload: str) -> str:
    """The connect token a client sends: base64url of ``{account, pluginName, payload}`` (NVCF's envelope)."""
    doc = {"account": account, "pluginName": plugin, "payload": payload}
    return _b64(json.dumps(doc, separators=(",", ":")).encode())


def open_envelope(token: str) -> tuple[str, str, str]:
    """``(account, pluginName, payload)`` of a token; padded and unpadded base64url both read."""
    try:
        doc = json.loads(_unb64(token))
        return str(doc["account"]), str(doc["pluginName"]), str(doc["payload"])
    except (ValueError, KeyError, TypeError) as err:
        raise CalloutError(f"the connect token is not an auth envelope: {err}") from err


@final
class CalloutStatus:
    """Whether this node answers auth callouts (the invocation plane offers the nats transport then)."""

    def __init__(self) -> None:
        self.available = False


#: Provided by the ``nats_auth`` plugin.
NATS_AUTH: ServiceKey[CalloutStatus] = ServiceKey("nvcf_mono.nats_auth.status")
