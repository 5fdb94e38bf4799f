"""The chain of strategies: asked in order, and a strategy only once its plugin has started."""

from __future__ import annotations

import pytest

from nvcf_mono.auth.principal import AuthError, Principal
from nvcf_mono.auth.strategy import STARTING, Authenticator


class Prefix:
    """Claims tokens that start with its prefix."""

    def __init__(self, name: str, prefix: str) -> None:
        self.name = name
        self.prefix = prefix
        self.asked = 0

    async def authenticate(self, token: str) -> Principal | None:
        self.asked += 1
        if not token.startswith(self.prefix):
            return None
        return Principal(kind="header_tokens", subject=token, account="acct", scopes=frozenset())


async def test_a_strategy_whose_plugin_has_not_started_is_not_asked_and_its_tokens_wait() -> None:
    builtin, plugin = Prefix("api_key", "nvapi-"), Prefix("mine", "my-")
    started = {"api_key": True, "mine": False}
    chain = Authenticator()
    chain.configure([builtin, plugin], ready=lambda s: started[s.name])

    assert (await chain.authenticate_token("nvapi-1")).subject == "nvapi-1"  # others answer meanwhile
    with pytest.raises(AuthError) as waiting:
        await chain.authenticate_token("my-1")
    assert waiting.value.status == STARTING == 503 and "mine" in waiting.value.detail
    assert plugin.asked == 0, "never asked before its plugin runs"

    started["mine"] = True
    assert (await chain.authenticate_token("my-1")).subject == "my-1"
    with pytest.raises(AuthError) as nobody:
        await chain.authenticate_token("other")
    assert nobody.value.status == 401


async def test_without_a_readiness_check_every_strategy_is_asked() -> None:
    chain = Authenticator()
    chain.configure([Prefix("a", "a-")])
    assert (await chain.authenticate_token("a-1")).subject == "a-1"
