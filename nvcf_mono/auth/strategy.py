"""Auth strategies and the chain that asks them in configured order; the first that claims decides."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Protocol, final

from nvcf_mono.auth.principal import AuthError, Principal
from nvcf_mono.services import ExtensionPoint, ServiceKey


class AuthStrategy(Protocol):
    """Turns a bearer token into a principal.

    Return ``None`` when the token is not of this strategy's kind (the next one is asked); raise
    :class:`AuthError` when it is, but is invalid, expired or revoked (the chain stops there).
    """

    name: str

    async def authenticate(self, token: str) -> Principal | None: ...


#: Strategies contributed by auth plugins (``api_key``, ``jwt``, ``static_token``, or your own).
AUTH_STRATEGIES: ExtensionPoint[AuthStrategy] = ExtensionPoint("nvcf_mono.auth.strategies")
#: The chain every API edge uses.
AUTHENTICATOR: ServiceKey[Authenticator] = ServiceKey("nvcf_mono.auth.authenticator")

MISSING_HEADER = "Header of type `authorization` was missing"
_TOKEN_RX = re.compile(r"[!-~]+")


def bearer_token(header: str | None) -> str:
    """The token of an ``Authorization: Bearer <token>`` header, or a 401."""
    if not header:
        raise AuthError(401, MISSING_HEADER)
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise AuthError(401, "expected 'Authorization: Bearer <token>'")
    if not _TOKEN_RX.fullmatch(token):
        # Keys, JWTs and the admin token are printable ASCII; anything else names no credential.
        raise AuthError(401, "the credential is not recognised: a bearer token is printable ASCII")
    return token


#: The status of a token that only a strategy still starting could have claimed: try again soon.
STARTING = 503


@final
class Authenticator:
    """Asks each strategy in order until one claims the token.

    A strategy is asked only once the plugin that contributed it runs (``ready``): a plugin's
    strategy may need what its plugin loads when it starts. A token nobody else claimed while one
    is still starting is a 503 (try again), not a 401.
    """

    def __init__(self) -> None:
        self._strategies: tuple[AuthStrategy, ...] = ()
        self._ready: Callable[[AuthStrategy], bool] = lambda _: True

    def configure(
        self, strategies: Sequence[AuthStrategy], *, ready: Callable[[AuthStrategy], bool] | None = None
    ) -> None:
        """Set the strategies, in the order they are asked, and how to tell one can be asked yet."""
        self._strategies = tuple(strategies)
        self._ready = ready or (lambda _: True)

    @property
    def strategies(self) -> tuple[AuthStrategy, ...]:
        return self._strategies

    async def authenticate(self, header: str | None) -> Principal:
        """The principal behind an ``Authorization`` header; raises :class:`AuthError` (401)."""
        return await self.authenticate_token(bearer_token(header))

    async def authenticate_token(self, token: str) -> Principal:
        """The principal behind a bare token."""
        starting = []
        for strategy in self._strategies:
            if not self._ready(strategy):
                starting.append(strategy.name)
                continue
            principal = await strategy.authenticate(token)
            if principal is not None:
                return principal
        if starting:
            raise AuthError(STARTING, f"authentication is still starting ({', '.join(starting)}); try again shortly")
        if not self._strategies:
            raise AuthError(401, "no authentication strategy is enabled on this node")
        raise AuthError(401, "the credential is not recognised")
