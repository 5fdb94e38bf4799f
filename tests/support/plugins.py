"""Plugins used by the host tests, loaded through ``extra_plugins`` like any user plugin."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, ClassVar

import anyio
import attrs
from aiohttp import web
from anyio.abc import TaskStatus

from nvcf_mono.auth import scopes
from nvcf_mono.auth.principal import AuthError, Principal
from nvcf_mono.auth.strategy import AUTH_STRATEGIES
from nvcf_mono.autoscaling import AUTOSCALING_POLICIES, ScalingDecision, ScalingInputs
from nvcf_mono.bus.api import BucketSpec, StreamSpec
from nvcf_mono.models.account import DEFAULT_ACCOUNT
from nvcf_mono.plugin import BasePlugin, PluginConfigError, PluginNotReady, PluginSpec, RunContext, SetupContext
from nvcf_mono.structure import Seconds, setting

#: What the plugins did, in order, per test run (tests clear it first).
EVENTS: list[str] = []


@attrs.frozen(kw_only=True)
class FlakyConfig:
    failures: int = setting(2, doc="How many times to raise PluginNotReady before starting.")


class Flaky(BasePlugin[FlakyConfig]):
    """Not ready ``failures`` times, then serves GET /flaky."""

    spec: ClassVar[PluginSpec] = PluginSpec(name="flaky", description="test: not ready twice", config_type=FlakyConfig)
    attempts = 0

    def setup(self, ctx: SetupContext) -> None:
        ctx.add_route("GET", "/flaky", self.hello)

    async def hello(self, request: web.Request) -> web.Response:
        return web.json_response({"attempts": Flaky.attempts})

    async def run(self, ctx: RunContext[FlakyConfig], *, task_status: TaskStatus[None]) -> None:
        Flaky.attempts += 1
        EVENTS.append(f"flaky:attempt:{Flaky.attempts}")
        if Flaky.attempts <= self.config.failures:
            raise PluginNotReady(f"dependency missing (attempt {Flaky.attempts})")
        task_status.started()
        await ctx.wait_stopping()


@attrs.frozen(kw_only=True)
class BoomConfig:
    after: Seconds = setting(0.2, doc="Seconds after start before run() raises.")


class Boom(BasePlugin[BoomConfig]):
    """Starts, then raises."""

    spec: ClassVar[PluginSpec] = PluginSpec(name="boom", description="test: fails after start", config_type=BoomConfig)

    async def run(self, ctx: RunContext[BoomConfig], *, task_status: TaskStatus[None]) -> None:
        task_status.started()
        await anyio.sleep(self.config.after)
        raise RuntimeError("boom: the plugin broke")


class Recorder(BasePlugin[Any]):
    """Records start and stop; declares a stream and a bucket; serves GET /recorder and a slow route."""

    spec: ClassVar[PluginSpec] = PluginSpec(name="recorder", description="test: records its lifecycle")

    def setup(self, ctx: SetupContext) -> None:
        ctx.declare_stream(StreamSpec(name="RECORDER", subjects=("recorder.>",)))
        ctx.declare_bucket(BucketSpec(name="recorder"))
        ctx.add_route("GET", "/recorder", self.hello)
        ctx.add_route("GET", "/recorder/slow", self.slow)
        ctx.add_route("GET", "/recorder/crash", self.crash)

    async def hello(self, request: web.Request) -> web.Response:
        return web.json_response({"hello": "recorder"})

    async def slow(self, request: web.Request) -> web.Response:
        EVENTS.append("recorder:slow:begin")
        logging.getLogger("tests.recorder").warning("recorder: a slow request began")  # what a test waits for
        await anyio.sleep(float(request.query.get("seconds", "1")))
        EVENTS.append("recorder:slow:end")
        return web.json_response({"slow": True})

    async def crash(self, request: web.Request) -> web.Response:
        raise ValueError("secret internal detail")

    async def run(self, ctx: RunContext[Any], *, task_status: TaskStatus[None]) -> None:
        EVENTS.append("recorder:start")
        try:  # a stop while it still publishes (a loaded machine) is recorded too
            await ctx.bus.stream("RECORDER").publish("recorder.started", b"1")
            task_status.started()
            await ctx.wait_stopping()
            EVENTS.append("recorder:stopping")
            await anyio.sleep_forever()
        finally:
            EVENTS.append("recorder:stop")


class After(BasePlugin[Any]):
    """Requires the recorder, so it starts after it and stops before it."""

    spec: ClassVar[PluginSpec] = PluginSpec(name="after", description="test: requires recorder", requires=("recorder",))

    async def run(self, ctx: RunContext[Any], *, task_status: TaskStatus[None]) -> None:
        EVENTS.append("after:start")
        try:
            task_status.started()
            await anyio.sleep_forever()
        finally:
            EVENTS.append("after:stop")


class StopWork(BasePlugin[Any]):
    """Has work to do when the host stops (as the compute plugin stops its instances), with nothing in flight."""

    spec: ClassVar[PluginSpec] = PluginSpec(name="stop_work", description="test: work at stop")

    async def run(self, ctx: RunContext[Any], *, task_status: TaskStatus[None]) -> None:
        task_status.started()
        async with ctx.when_stopping():
            EVENTS.append("stop_work:begin")
            try:
                await anyio.sleep(0.5)
                EVENTS.append("stop_work:done")
            except anyio.get_cancelled_exc_class():
                EVENTS.append("stop_work:cancelled")
                raise


class BadSetup(BasePlugin[Any]):
    """Refuses its configuration in setup()."""

    spec: ClassVar[PluginSpec] = PluginSpec(name="bad_setup", description="test: bad config")

    def setup(self, ctx: SetupContext) -> None:
        raise PluginConfigError("needs a kubeconfig")


class NeverStarts(BasePlugin[Any]):
    """Returns from run() without calling started()."""

    spec: ClassVar[PluginSpec] = PluginSpec(name="never_starts", description="test: forgets started()")

    async def run(self, ctx: RunContext[Any], *, task_status: TaskStatus[None]) -> None:
        return


@attrs.frozen(kw_only=True)
class Image:
    """How to run one image locally."""

    command: tuple[str, ...] = setting((), doc="Command line of the image's server.")
    port: int = setting(8000, doc="Port the server listens on.")


class Catalogued(BasePlugin[Any]):
    """Owns the top-level ``test_images:`` section, as the compute plugin owns ``images:``."""

    spec: ClassVar[PluginSpec] = PluginSpec(
        name="catalogued", description="test: owns test_images", sections={"test_images": Mapping[str, Image]}
    )

    def setup(self, ctx: SetupContext) -> None:
        EVENTS.append(f"catalogued:test_images:{sorted(ctx.section('test_images'))}")


class HeaderTokens:
    """An auth strategy as a third party writes one (README, "An auth strategy"): tokens ``my-<account>``."""

    name = "header_tokens"

    async def authenticate(self, token: str) -> Principal | None:
        if not token.startswith("my-"):
            return None  # not ours: the next strategy is asked
        account = TOKENS.get(token)
        if account is None:
            raise AuthError(401, "unknown my- token")  # ours, and invalid: the chain stops here
        return Principal(
            kind="header_tokens",
            subject=token,
            account=account,
            scopes=frozenset({scopes.INVOKE_FUNCTION, scopes.LIST_FUNCTIONS}),
        )


TOKENS = {"my-default": DEFAULT_ACCOUNT}


class MyAuth(BasePlugin[None]):
    """Contributes :class:`HeaderTokens` to the auth chain."""

    spec: ClassVar[PluginSpec] = PluginSpec(
        name="my_auth",
        description="test: a third-party auth strategy",
        roles=frozenset({"all-in-one", "control", "invocation"}),
        requires=("auth",),
    )

    def setup(self, ctx: SetupContext) -> None:
        ctx.extend(AUTH_STRATEGIES, HeaderTokens())


class _Broken:
    """Raises for functions named ``broken``: the platform's algorithm must decide for them instead."""

    name = "broken"

    def decide(self, inputs: ScalingInputs) -> ScalingDecision | None:
        if inputs.function_name == "broken":
            raise RuntimeError("a bug in a policy plugin")
        return None


class _TwoForFixed:
    """Two instances for functions named ``fixed``, whatever their load."""

    name = "two_for_fixed"

    def decide(self, inputs: ScalingInputs) -> ScalingDecision | None:
        return ScalingDecision(2, "always two") if inputs.function_name == "fixed" else None


class Policies(BasePlugin[None]):
    """Contributes the two test policies above, in that order."""

    spec: ClassVar[PluginSpec] = PluginSpec(
        name="test_policies", description="test: autoscaling policies", requires=("control",)
    )

    def setup(self, ctx: SetupContext) -> None:
        ctx.extend(AUTOSCALING_POLICIES, _Broken())
        ctx.extend(AUTOSCALING_POLICIES, _TwoForFixed())
