"""The control plane's plugin: management API, accounts and keys, clusters, deployments, autoscaler.

So far it only takes its place in the host (roles all-in-one and control); the management API and
reconcilers arrive with the control-plane work.
"""

from __future__ import annotations

from typing import ClassVar

from nvcf_mono.plugin import BasePlugin, NoConfig, PluginSpec


class ControlPlane(BasePlugin[NoConfig]):
    """Plugin ``control``."""

    spec: ClassVar[PluginSpec] = PluginSpec(
        name="control",
        description="Control plane: the NVCF management API, accounts, keys, clusters and deployments.",
        roles=frozenset({"all-in-one", "control"}),
        config_type=NoConfig,
    )
