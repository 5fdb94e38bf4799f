"""Plugin ``nats_auth``: the NATS auth callout responder, whose strategies are plugins too.

Connections the server does not know itself (workers on the nats transport) arrive as
authorization requests. Their connect token is NVCF's envelope ``{account, pluginName, payload}``;
the strategy named by ``pluginName`` decides and returns what the connection may do. The built-in
``worker`` strategy accepts a worker session token and grants the allow-list of
``contracts/permissions.py``, scoped to the session's version, durable and inbox prefix (all from
the token's claims). Add a strategy by contributing to ``NATS_AUTH_STRATEGIES``.

The answers are signed with the issuer key the server trusts: the embedded server's (created in
its state directory), or ``plugins.nats_auth.issuer_seed_file`` for an external NATS configured
with ``authorization { auth_callout { issuer: <its public key>, auth_users: [...] } }``.
"""

from __future__ import annotations

import logging
from functools import partial
from pathlib import Path
from typing import ClassVar, Protocol, final

import anyio
import attrs
from anyio.abc import TaskStatus

from nvcf_mono.auth.secret import KEYRING, Keyring
from nvcf_mono.auth.tokens import InvalidToken, TokenSigner
from nvcf_mono.bus.api import Msg
from nvcf_mono.bus.callout import (
    CALLOUT_SUBJECT,
    NATS_AUTH,
    AuthorizationRequest,
    CalloutError,
    CalloutStatus,
    Grant,
    Issuer,
    authorization_response,
    open_envelope,
)
from nvcf_mono.contracts import permissions
from nvcf_mono.log import Throttle
from nvcf_mono.plugin import BasePlugin, PluginSpec, RunContext, SetupContext
from nvcf_mono.services import ExtensionPoint
from nvcf_mono.structure import Seconds, positive, setting

CALLOUT_QUEUE = "nvcf-auth-callout"


class Refused(Exception):
    """The strategy claims the connection and refuses it (the reason goes to the server's log)."""


class NatsAuthStrategy(Protocol):
    """Decides connections whose envelope names it (``pluginName``)."""

    name: str

    async def authorize(self, account: str, payload: str, request: AuthorizationRequest) -> Grant: ...


#: Strategies by envelope plugin name.
NATS_AUTH_STRATEGIES: ExtensionPoint[NatsAuthStrategy] = ExtensionPoint("nvcf_mono.nats_auth.strategies")


@final
class WorkerStrategy:
    """A worker session token -> its version's consumer, cancels, and the way back to the nodes."""

    name = "worker"

    def __init__(self, ttl: float) -> None:
        self._ttl = ttl
        self.keyring: Keyring | None = None

    async def authorize(self, account: str, payload: str, request: AuthorizationRequest) -> Grant:
        if self.keyring is None:
            raise Refused("not ready")
        try:
            claims = TokenSigner(self.keyring.token_key).verify(payload, permissions.WORKER_SESSION)
        except InvalidToken as err:
            raise Refused(f"invalid worker session token: {err}") from err
        stream, durable, fvid = str(claims.get("st", "")), str(claims.get("du", "")), str(claims["fvid"])
        inbox = str(claims.get("ib", ""))
        if not stream or not durable or not inbox:
            raise Refused("the session is not one of the nats transport")
        try:
            return Grant(
                name=f"worker-{fvid}",
                publish=permissions.worker_publish(stream, durable),
                subscribe=permissions.worker_subscribe(fvid, inbox),
                expires_in=self._ttl,
            )
        except permissions.NotGrantable as err:
            raise Refused(str(err)) from err


@attrs.frozen(kw_only=True)
class NatsAuthConfig:
    """Settings of the auth callout responder."""

    issuer_seed_file: Path | None = setting(
        None,
        doc="32-byte seed of the issuer account key the NATS server trusts for auth callout. Default: the "
        "embedded server's (<state_dir>/nats/callout-issuer.seed); unset with an external NATS: no callout.",
    )
    grant_ttl: Seconds = setting(
        3 * 3600.0, doc="Lifetime of a granted NATS connection (workers reconnect with a fresh token).", check=positive
    )


class NatsAuth(BasePlugin[NatsAuthConfig]):
    """Plugin ``nats_auth``."""

    spec: ClassVar[PluginSpec] = PluginSpec(
        name="nats_auth",
        description="NATS auth callout: workers on the nats transport get credentials scoped to their version.",
        roles=frozenset({"all-in-one", "invocation"}),
        requires=("auth",),
        config_type=NatsAuthConfig,
    )

    def setup(self, ctx: SetupContext) -> None:
        self.status = CalloutStatus()
        self.worker = WorkerStrategy(self.config.grant_ttl)
        ctx.extend(NATS_AUTH_STRATEGIES, self.worker)
        ctx.provide(NATS_AUTH, self.status)
        seed = self.config.issuer_seed_file
        if seed is None and ctx.settings.bus.url is None and ctx.settings.embedded_nats.auth_callout:
            seed = ctx.settings.state_dir / "nats" / "callout-issuer.seed"
        self.seed_file = seed

    async def run(self, ctx: RunContext[NatsAuthConfig], *, task_status: TaskStatus[None]) -> None:
        self.worker.keyring = ctx.services.get(KEYRING)
        if self.seed_file is None:
            ctx.log.info("no auth-callout issuer configured: workers use the grpc transport")
            task_status.started()
            await ctx.wait_stopping()
            return
        issuer = Issuer(self.seed_file.read_bytes())
        strategies = {ext.value.name: ext.value for ext in ctx.services.extensions(NATS_AUTH_STRATEGIES)}
        refusals = Throttle()  # anything that reaches the NATS port can try, as often as it likes

        async def answer(msg: Msg) -> bytes:
            try:
                request = AuthorizationRequest.decode(msg.data.decode())
            except CalloutError as err:
                ctx.log.warning("ignoring a malformed authorization request: %s", err)
                return b""
            try:
                account, plugin, payload = open_envelope(request.token)
                strategy = strategies.get(plugin)
                if strategy is None:
                    raise Refused(f"no NATS auth strategy {plugin!r}")
                grant = await strategy.authorize(account, payload, request)
            except (CalloutError, Refused) as err:
                refusals.log(
                    ctx.log,
                    logging.INFO,
                    "refused NATS connection %r from %s: %s",
                    request.client_name,
                    request.client_host,
                    err,
                )
                return authorization_response(request, issuer, error=str(err))
            return authorization_response(request, issuer, grant=grant)

        async with anyio.create_task_group() as tg:
            await tg.start(partial(ctx.bus.serve, CALLOUT_SUBJECT, answer, queue=CALLOUT_QUEUE))
            self.status.available = True
            task_status.started()
            await ctx.wait_stopping()
            self.status.available = False
            tg.cancel_scope.cancel()
