"""Plugin ``auth_jwt``: JWTs (ES256/RS256) from configured issuers, checked against their JWKS.

Authorities are the ``scopes`` claim, verbatim. The account is a claim when ``account_claim`` is
set, else the ``sub`` (a client id) mapped through the accounts' ``adminClientIds``; an unmapped
client gets NVCF's 404 "Unknown client_id".
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any, ClassVar, final

import aiohttp
import anyio
import attrs
import jwt
from anyio.abc import TaskStatus

from nvcf_mono.auth.principal import AuthError, Principal
from nvcf_mono.auth.strategy import AUTH_STRATEGIES
from nvcf_mono.bus.mirror import KvMirror
from nvcf_mono.contracts import buckets
from nvcf_mono.models.account import Account
from nvcf_mono.plugin import BasePlugin, PluginSpec, RunContext, SetupContext
from nvcf_mono.plugins.auth import API_ROLES
from nvcf_mono.structure import Seconds, optional, positive, setting

_ALGORITHMS = frozenset({"ES256", "ES384", "RS256", "RS384", "RS512", "PS256", "EdDSA"})


def _check_algorithms(value: tuple[str, ...]) -> str | None:
    bad = [a for a in value if a not in _ALGORITHMS]
    return f"unsupported algorithms {bad}; use {sorted(_ALGORITHMS)}" if bad else None


@attrs.frozen(kw_only=True)
class JwtIssuer:
    """One trusted token issuer."""

    issuer: str = setting(doc="The `iss` claim this issuer writes.")
    jwks_url: str | None = setting(None, doc="Where its JWKS is served (https://.../jwks.json).")
    jwks_file: Path | None = setting(None, doc="Or a local JWKS file.")
    audience: str | None = setting(None, doc="Required `aud` claim, if any.")
    algorithms: tuple[str, ...] = setting(
        ("ES256", "RS256"), doc="Accepted signature algorithms.", check=_check_algorithms
    )

    def __checks__(self) -> list[tuple[str, str]]:
        if (self.jwks_url is None) == (self.jwks_file is None):
            return [("jwks_url", "give exactly one of jwks_url and jwks_file")]
        return []


@attrs.frozen(kw_only=True)
class JwtConfig:
    """Settings of JWT authentication."""

    issuers: tuple[JwtIssuer, ...] = setting((), doc="Trusted issuers; none: JWTs are not accepted.")
    account_claim: str | None = setting(
        None, doc="Claim holding the account (NCA id). Unset: map `sub` through accounts' adminClientIds."
    )
    scopes_claim: str = setting("scopes", doc="Claim holding the scopes (a list, or a space-separated string).")
    leeway: Seconds = setting(10.0, doc="Clock skew tolerated on exp/nbf.")
    jwks_refresh: Seconds = setting(300.0, doc="How often a JWKS URL is re-read.", check=positive)
    jwks_timeout: Seconds = setting(5.0, doc="Deadline of one JWKS download.", check=positive)
    cache_size: int = setting(1024, doc="Verified tokens kept (until their exp) to skip re-verification.")
    default_account: str | None = setting(
        None,
        doc="Account for tokens whose client id is not mapped (unset: 404 'Unknown client_id').",
        check=optional(lambda v: None if v else "must not be empty"),
    )


@final
class _Keys:
    """One issuer's JWKS, refreshed on a timer and when an unknown key id shows up."""

    def __init__(self, issuer: JwtIssuer, config: JwtConfig) -> None:
        self.issuer = issuer
        self._config = config
        self._keys: dict[str, Any] = {}
        self._loaded_at = 0.0
        self._lock = anyio.Lock()

    async def key(self, kid: str | None) -> Any:
        if self._stale() or (kid is not None and kid not in self._keys):
            await self.refresh(force=kid is not None and kid not in self._keys)
        if kid is None:
            if len(self._keys) == 1:
                return next(iter(self._keys.values()))
            raise AuthError(401, "the JWT has no key id (kid) and the issuer has several keys")
        found = self._keys.get(kid)
        if found is None:
            raise AuthError(401, f"no key {kid!r} in the issuer's JWKS")
        return found

    def _stale(self) -> bool:
        return time.monotonic() - self._loaded_at > self._config.jwks_refresh

    async def refresh(self, *, force: bool = False) -> None:
        async with self._lock:
            # An unknown kid may refresh at most every 30 s, so a flood of forged tokens cannot hammer the issuer.
            if force and time.monotonic() - self._loaded_at < 30 and self._keys:
                return
            try:
                document = await self._read()
            except AuthError:
                if not self._keys:
                    raise
                self._loaded_at = time.monotonic()  # keep the keys we have; try again after the refresh period
                return
            keys: dict[str, Any] = {}
            for index, jwk in enumerate(document.get("keys", [])):
                try:
                    keys[jwk.get("kid", f"#{index}")] = jwt.PyJWK(jwk).key
                except (jwt.PyJWTError, ValueError, TypeError):
                    continue
            self._keys = keys
            self._loaded_at = time.monotonic()

    async def _read(self) -> dict[str, Any]:
        try:
            if self.issuer.jwks_file is not None:
                doc = json.loads(await anyio.Path(self.issuer.jwks_file).read_text())
            else:
                timeout = aiohttp.ClientTimeout(total=self._config.jwks_timeout)
                async with (
                    aiohttp.ClientSession(timeout=timeout) as session,
                    session.get(str(self.issuer.jwks_url)) as resp,
                ):
                    resp.raise_for_status()
                    doc = await resp.json(content_type=None)
        except (OSError, ValueError, aiohttp.ClientError, TimeoutError) as err:
            raise AuthError(503, f"cannot read the JWKS of issuer {self.issuer.issuer!r}: {err}") from err
        if not isinstance(doc, dict):
            raise AuthError(503, f"the JWKS of issuer {self.issuer.issuer!r} is not a JSON object")
        return doc


@final
class JwtStrategy:
    """Claims tokens that look like JWTs."""

    name = "jwt"

    def __init__(self, config: JwtConfig) -> None:
        self._config = config
        self._issuers = {i.issuer: _Keys(i, config) for i in config.issuers}
        self._cache: OrderedDict[str, tuple[Principal, float]] = OrderedDict()
        self.accounts: KvMirror[Account] | None = None

    async def authenticate(self, token: str) -> Principal | None:
        if token.count(".") != 2 or not self._issuers:
            return None
        try:
            header = jwt.get_unverified_header(token)
            unverified = jwt.decode(token, options={"verify_signature": False})
        except jwt.PyJWTError:
            return None  # not a JWT: let another strategy try
        cached = self._cache.get(token)
        if cached is not None and cached[1] > time.time():
            self._cache.move_to_end(token)
            return cached[0]
        keys = self._issuers.get(str(unverified.get("iss", "")))
        if keys is None:
            raise AuthError(401, "the JWT's issuer is not trusted")
        key = await keys.key(header.get("kid"))
        try:
            claims = jwt.decode(
                token,
                key,
                algorithms=list(keys.issuer.algorithms),
                audience=keys.issuer.audience,
                issuer=keys.issuer.issuer,
                leeway=self._config.leeway,
                options={"require": ["exp", "sub"], "verify_aud": keys.issuer.audience is not None},
            )
        except jwt.ExpiredSignatureError as err:
            raise AuthError(401, "the JWT has expired") from err
        except jwt.PyJWTError as err:
            raise AuthError(401, f"invalid JWT: {err}") from err
        principal = Principal(
            kind="jwt", subject=str(claims["sub"]), account=self._account(claims), scopes=self._scopes(claims)
        )
        # Cached at most a minute: an account change (a client disassociated) takes effect soon.
        self._cache[token] = (principal, min(float(claims["exp"]), time.time() + 60))
        while len(self._cache) > self._config.cache_size:
            self._cache.popitem(last=False)
        return principal

    def _scopes(self, claims: dict[str, Any]) -> frozenset[str]:
        raw = claims.get(self._config.scopes_claim, [])
        if isinstance(raw, str):
            return frozenset(raw.split())
        return frozenset(str(s) for s in raw) if isinstance(raw, list) else frozenset()

    def _account(self, claims: dict[str, Any]) -> str:
        if self._config.account_claim is not None:
            value = claims.get(self._config.account_claim)
            if not isinstance(value, str) or not value:
                raise AuthError(401, f"the JWT has no {self._config.account_claim!r} claim")
            return value
        sub = str(claims["sub"])
        if self.accounts is not None:
            for account in self.accounts.values():
                if sub in account.admin_client_ids:
                    return account.nca_id
        if self._config.default_account is not None:
            return self._config.default_account
        raise AuthError(404, "Unknown client_id")


class JwtAuth(BasePlugin[JwtConfig]):
    """Plugin ``auth_jwt``."""

    spec: ClassVar[PluginSpec] = PluginSpec(
        name="auth_jwt",
        description="Auth strategy: ES256/RS256 JWTs checked against trusted issuers' JWKS.",
        roles=API_ROLES,
        requires=("auth",),
        config_type=JwtConfig,
    )

    def setup(self, ctx: SetupContext) -> None:
        self.strategy = JwtStrategy(self.config)
        ctx.declare_bucket(buckets.ACCOUNTS)
        ctx.extend(AUTH_STRATEGIES, self.strategy)

    async def run(self, ctx: RunContext[JwtConfig], *, task_status: TaskStatus[None]) -> None:
        async with anyio.create_task_group() as tg:
            if self.config.account_claim is None:
                accounts = KvMirror(ctx.bus.kv(buckets.ACCOUNTS.name), buckets.ACCOUNT, log=ctx.log)
                await tg.start(accounts.run, ctx.bus)
                self.strategy.accounts = accounts
            task_status.started()
            await ctx.wait_stopping()
            tg.cancel_scope.cancel()
