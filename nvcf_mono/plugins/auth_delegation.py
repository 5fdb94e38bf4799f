"""Plugin ``auth_delegation``: function delegation tokens (``POST /v2/nvcf/tokens/functions``).

The control plane mints them; every API node accepts them as bearers for invoking the functions they
name. Off, the minting routes answer 503 and such tokens are not recognised.
"""

from __future__ import annotations

from typing import ClassVar

import attrs
from anyio.abc import TaskStatus

from nvcf_mono.auth.delegation import DELEGATION_TOKENS, DelegationTokens
from nvcf_mono.auth.keystore import API_KEY_STORE
from nvcf_mono.auth.secret import KEYRING
from nvcf_mono.auth.strategy import AUTH_STRATEGIES
from nvcf_mono.plugin import BasePlugin, PluginSpec, RunContext, SetupContext
from nvcf_mono.plugins.auth import API_ROLES
from nvcf_mono.structure import Seconds, in_range, setting


@attrs.frozen(kw_only=True)
class DelegationConfig:
    """Settings of delegation tokens."""

    lifetime: Seconds = setting(
        3600.0,
        doc="How long a delegation token is valid, in seconds (never past the expiry of the API key that minted it).",
        check=in_range(60, 7 * 86400),
    )


class DelegationAuth(BasePlugin[DelegationConfig]):
    """Plugin ``auth_delegation``."""

    spec: ClassVar[PluginSpec] = PluginSpec(
        name="auth_delegation",
        description="Auth strategy: function delegation tokens (minted by POST /v2/nvcf/tokens/functions).",
        roles=API_ROLES,
        requires=("auth",),
        after=("auth_api_key",),  # a token an API key minted is checked against the key
        config_type=DelegationConfig,
    )

    def setup(self, ctx: SetupContext) -> None:
        self.tokens = DelegationTokens(lifetime=self.config.lifetime)
        ctx.extend(AUTH_STRATEGIES, self.tokens)
        ctx.provide(DELEGATION_TOKENS, self.tokens)

    async def run(self, ctx: RunContext[DelegationConfig], *, task_status: TaskStatus[None]) -> None:
        self.tokens.bind(ctx.services.get(KEYRING), ctx.services.find(API_KEY_STORE))
        task_status.started()
        await ctx.wait_stopping()
