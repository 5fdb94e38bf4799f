"""Plugin ``auth``: the platform secret and the chain of auth strategies every API edge uses.

Strategies are other plugins (``auth_api_key``, ``auth_jwt``, ``auth_static_token``, ``auth_delegation``
or your own) contributing to ``AUTH_STRATEGIES``; ``plugins.auth.order`` says in which order they are
asked.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import attrs
from anyio.abc import TaskStatus

from nvcf_mono.auth.secret import KEYRING, Keyring, PlatformSecret, SecretFileError
from nvcf_mono.auth.strategy import AUTH_STRATEGIES, AUTHENTICATOR, Authenticator
from nvcf_mono.plugin import BasePlugin, PluginConfigError, PluginSpec, RunContext, SetupContext
from nvcf_mono.structure import setting

SECRET_FILE = "platform-secret"
API_ROLES = frozenset({"all-in-one", "control", "invocation"})


@attrs.frozen(kw_only=True)
class AuthConfig:
    """Settings of the auth chain."""

    secret_file: Path | None = setting(
        None,
        doc="The platform secret every node derives its keys from. Default: <state_dir>/platform-secret, "
        "generated on first start by all-in-one; other roles must be given the same file as every other node.",
    )
    generate_secret: bool | None = setting(
        None,
        doc="Create the secret file when it is missing. Default: only in the all-in-one role.",
    )
    order: tuple[str, ...] = setting(
        ("static_token", "api_key", "jwt"),
        doc="The order in which auth strategies are asked; the first that claims a token decides. "
        "Enabled strategies not listed are asked last, in start order.",
    )


class Auth(BasePlugin[AuthConfig]):
    """Plugin ``auth``."""

    spec: ClassVar[PluginSpec] = PluginSpec(
        name="auth",
        description="The platform secret and the auth strategy chain of the API edges.",
        roles=API_ROLES,
        config_type=AuthConfig,
    )

    def setup(self, ctx: SetupContext) -> None:
        self.keyring = Keyring()
        self.authenticator = Authenticator()
        self.path = self.config.secret_file or ctx.settings.state_dir / SECRET_FILE
        generate = self.config.generate_secret
        self.generate = ctx.settings.role == "all-in-one" if generate is None else generate
        if not self.generate and not self.path.exists():
            raise PluginConfigError(
                f"the platform secret {self.path} does not exist. With role {ctx.settings.role!r} every node must "
                "share one: copy it from the first node, or create it with `nvcf-mono secret generate "
                f"{self.path}` and distribute it (plugins.auth.secret_file sets where it is read)"
            )
        ctx.provide(KEYRING, self.keyring)
        ctx.provide(AUTHENTICATOR, self.authenticator)

    async def run(self, ctx: RunContext[AuthConfig], *, task_status: TaskStatus[None]) -> None:
        try:
            secret = PlatformSecret.load_or_create(self.path) if self.generate else PlatformSecret.load(self.path)
        except SecretFileError as err:
            raise PluginConfigError(str(err)) from err
        self.keyring.load(secret)
        ctx.log.info("platform secret %s (fingerprint %s)", self.path, secret.fingerprint())
        extensions = ctx.services.extensions(AUTH_STRATEGIES)
        strategies = {ext.value.name: ext.value for ext in extensions}
        owners = {id(ext.value): ext.owner for ext in extensions}
        ordered = [strategies.pop(name) for name in self.config.order if name in strategies]
        # A plugin's strategy is asked once its plugin has started (it may load what it checks then).
        self.authenticator.configure(
            [*ordered, *strategies.values()], ready=lambda strategy: ctx.plugin_running(owners[id(strategy)])
        )
        task_status.started()
        await ctx.wait_stopping()
