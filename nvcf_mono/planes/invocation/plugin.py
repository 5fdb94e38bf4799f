"""The invocation plane's plugin: pexec/exec, status polling, the durable request buffer, WorkerService.

So far it only takes its place in the host (roles all-in-one and invocation); the invocation API and
WorkerService arrive with the invocation-plane work.
"""

from __future__ import annotations

from typing import ClassVar

from nvcf_mono.plugin import BasePlugin, NoConfig, PluginSpec


class InvocationPlane(BasePlugin[NoConfig]):
    """Plugin ``invocation``."""

    spec: ClassVar[PluginSpec] = PluginSpec(
        name="invocation",
        description="Invocation plane: NVCF invocation over a durable JetStream buffer, and the WorkerService.",
        roles=frozenset({"all-in-one", "invocation"}),
        config_type=NoConfig,
    )
