"""The compute plane's plugin: the cluster agent (NVCA) and its backends.

So far it only takes its place in the host (roles all-in-one and compute); the cluster agent and
the local backend arrive with the compute-plane work.
"""

from __future__ import annotations

from typing import ClassVar

from nvcf_mono.plugin import BasePlugin, NoConfig, PluginSpec


class ComputePlane(BasePlugin[NoConfig]):
    """Plugin ``compute``."""

    spec: ClassVar[PluginSpec] = PluginSpec(
        name="compute",
        description="Compute plane: the cluster agent that runs function instances on its backend.",
        roles=frozenset({"all-in-one", "compute"}),
        config_type=NoConfig,
    )
