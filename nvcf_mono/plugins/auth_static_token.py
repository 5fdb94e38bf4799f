"""Plugin ``auth_static_token``: the bootstrap admin token (from the platform secret) and extra tokens.

The admin token holds every scope, acts for the default account, and reaches other accounts through
the ``/accounts/{ncaId}`` routes. Keep it for bootstrap: mint API keys for everything else.
"""

from __future__ import annotations

import hmac
from typing import ClassVar, final

import attrs
from anyio.abc import TaskStatus

from nvcf_mono.auth import scopes
from nvcf_mono.auth.principal import Principal
from nvcf_mono.auth.secret import KEYRING, Keyring
from nvcf_mono.auth.strategy import AUTH_STRATEGIES
from nvcf_mono.models.account import DEFAULT_ACCOUNT
from nvcf_mono.plugin import BasePlugin, PluginSpec, RunContext, SetupContext
from nvcf_mono.plugins.auth import API_ROLES
from nvcf_mono.structure import setting


@attrs.frozen(kw_only=True)
class StaticTokenConfig:
    """Settings of the static admin tokens."""

    account: str = setting(DEFAULT_ACCOUNT, doc="The account the admin token acts for on tenant routes.")
    extra_tokens: tuple[str, ...] = setting(
        (), doc="More admin tokens, e.g. from a secret store (each at least 32 characters).", secret=True
    )
    derived_token: bool = setting(True, doc="Accept the admin token derived from the platform secret.")

    def __checks__(self) -> list[tuple[str, str]]:
        return [("extra_tokens", "each token needs at least 32 characters") for t in self.extra_tokens if len(t) < 32]


@final
class StaticTokenStrategy:
    """Claims exactly the configured admin tokens."""

    name = "static_token"

    def __init__(self, config: StaticTokenConfig) -> None:
        self._config = config
        self._tokens = tuple(t.encode() for t in config.extra_tokens)

    def bind(self, keyring: Keyring) -> None:
        """Add the token derived from the platform secret (known once the auth plugin runs)."""
        if self._config.derived_token:
            self._tokens = (*self._tokens, keyring.admin_token.encode())

    async def authenticate(self, token: str) -> Principal | None:
        presented = token.encode()
        if not any(hmac.compare_digest(presented, t) for t in self._tokens):
            return None
        return Principal(kind="admin_token", subject="admin", account=self._config.account, scopes=scopes.ALL_SCOPES)


class StaticTokenAuth(BasePlugin[StaticTokenConfig]):
    """Plugin ``auth_static_token``."""

    spec: ClassVar[PluginSpec] = PluginSpec(
        name="auth_static_token",
        description="Auth strategy: the bootstrap admin token and configured static tokens.",
        roles=API_ROLES,
        requires=("auth",),
        config_type=StaticTokenConfig,
    )

    def setup(self, ctx: SetupContext) -> None:
        self.strategy = StaticTokenStrategy(self.config)
        ctx.extend(AUTH_STRATEGIES, self.strategy)

    async def run(self, ctx: RunContext[StaticTokenConfig], *, task_status: TaskStatus[None]) -> None:
        keyring = ctx.services.get(KEYRING)
        self.strategy.bind(keyring)
        if self.config.derived_token:
            ctx.set_credential("admin_token", keyring.admin_token)
        task_status.started()
        await ctx.wait_stopping()
