"""Plugin ``auth_api_key``: NVCF ``nvapi-`` API keys, verified from a watch-fed copy of the key bucket."""

from __future__ import annotations

from datetime import timedelta
from typing import ClassVar, final

import anyio
from anyio.abc import TaskStatus

from nvcf_mono.auth.keystore import API_KEY_STORE, ApiKeyStore
from nvcf_mono.auth.principal import Principal
from nvcf_mono.auth.secret import KEYRING
from nvcf_mono.auth.strategy import AUTH_STRATEGIES
from nvcf_mono.bus.errors import BusError
from nvcf_mono.contracts import buckets
from nvcf_mono.plugin import BasePlugin, NoConfig, PluginSpec, RunContext, SetupContext
from nvcf_mono.plugins.auth import API_ROLES

#: Expired keys stay listed (as EXPIRED) this long before their records are removed.
EXPIRED_KEPT = timedelta(days=30)
#: How often each node looks for keys to remove.
SWEEP_EVERY = 3600.0


@final
class ApiKeyStrategy:
    """Claims tokens that start with ``nvapi-``."""

    name = "api_key"

    def __init__(self, store: ApiKeyStore) -> None:
        self._store = store

    async def authenticate(self, token: str) -> Principal | None:
        return self._store.verify(token)


class ApiKeyAuth(BasePlugin[NoConfig]):
    """Plugin ``auth_api_key``."""

    spec: ClassVar[PluginSpec] = PluginSpec(
        name="auth_api_key",
        description="Auth strategy: nvapi- API keys (hashes in KV, verified locally, revocation at once).",
        roles=API_ROLES,
        requires=("auth",),
        config_type=NoConfig,
    )

    def setup(self, ctx: SetupContext) -> None:
        self.store = ApiKeyStore(log=ctx.log)
        ctx.declare_bucket(buckets.API_KEYS)
        ctx.extend(AUTH_STRATEGIES, ApiKeyStrategy(self.store))
        ctx.provide(API_KEY_STORE, self.store)

    async def run(self, ctx: RunContext[NoConfig], *, task_status: TaskStatus[None]) -> None:
        self.store.bind(ctx.services.get(KEYRING))
        async with anyio.create_task_group() as tg:
            await tg.start(self.store.run, ctx.bus)
            tg.start_soon(self._sweep, ctx, name="auth_api_key:sweep")
            task_status.started()
            await ctx.wait_stopping()
            tg.cancel_scope.cancel()

    async def _sweep(self, ctx: RunContext[NoConfig]) -> None:
        """Remove keys long expired, now and then (every node may; a key removed twice is no harm)."""
        while True:
            try:
                gone = await self.store.remove_expired(EXPIRED_KEPT)
            except BusError as err:
                ctx.log.warning("could not remove expired API keys: %s", err)
            else:
                if gone:
                    ctx.log.info("removed %d API keys expired more than %d days ago", gone, EXPIRED_KEPT.days)
            await anyio.sleep(SWEEP_EVERY)
