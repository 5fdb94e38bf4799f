"""A MiniService extension plugin: Helm functions that survive node maintenance, and fail fast when they
run out of memory.

On a GPU cluster, draining a node for maintenance evicts whatever runs there. This extension lets an
operator make Helm functions and tasks resist it, and judge them by two more rules:

- **a kind**: charts may contain ``policy/v1`` ``PodDisruptionBudget`` objects (not in the built-in list);
- **a mutation**: every pod template gets the cluster autoscaler's ``safe-to-evict: "false"``
  annotation, and every object a ``team`` label naming the account that owns it (for cost reports);
- **health rules**: an instance waits until each of its PodDisruptionBudgets has the healthy pods it
  asks for, and fails at once when one of its containers was killed for running out of memory (the
  built-in rules would wait for a restart loop), with a detail that says what to change.

    plugins:
      disruption_budgets:
        enabled: true
        team_label: example.com/team
        fail_on_oom: true
"""

from __future__ import annotations

from typing import Any, ClassVar

import attrs

from nvcf_mono.miniservice_extensions import (
    MINISERVICE_EXTENSIONS,
    Install,
    Manifest,
    MiniServiceExtension,
    ObjectHealth,
    ObjectKind,
)
from nvcf_mono.plugin import BasePlugin, PluginSpec, SetupContext
from nvcf_mono.structure import setting

SAFE_TO_EVICT = "cluster-autoscaler.kubernetes.io/safe-to-evict"
WORKLOADS = ("Deployment", "StatefulSet", "ReplicaSet", "Job")


@attrs.frozen(kw_only=True)
class DisruptionBudgetsConfig:
    team_label: str = setting("example.com/team", doc="Label set on every object to the owning account's id.")
    fail_on_oom: bool = setting(True, doc="A container killed for running out of memory fails the instance.")


class DisruptionBudgets(MiniServiceExtension):
    """The extension itself: plain functions of an object, easy to test on their own."""

    name = "disruption_budgets"
    kinds = (ObjectKind("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets"),)
    health_kinds = ("PodDisruptionBudget",)

    def __init__(self, config: DisruptionBudgetsConfig) -> None:
        self.config = config

    def mutate(self, obj: Manifest, install: Install) -> Manifest:
        obj.setdefault("metadata", {}).setdefault("labels", {})[self.config.team_label] = install.nca_id
        template = _pod_template(obj)
        if template is not None:
            template.setdefault("metadata", {}).setdefault("annotations", {})[SAFE_TO_EVICT] = "false"
        return obj

    def health(self, obj: Manifest, install: Install) -> ObjectHealth | None:
        if obj.get("kind") == "PodDisruptionBudget":
            status = obj.get("status") or {}
            healthy, wanted = int(status.get("currentHealthy", 0)), int(status.get("desiredHealthy", 0))
            if healthy < wanted or not status:
                return ObjectHealth("waiting", f"{healthy} of {wanted} pods the budget asks for are healthy")
            return ObjectHealth("ready")
        if obj.get("kind") in (None, "Pod") and self.config.fail_on_oom:
            for container in (obj.get("status") or {}).get("containerStatuses") or ():
                for state in (container.get("state") or {}, container.get("lastState") or {}):
                    if (state.get("terminated") or {}).get("reason") == "OOMKilled":
                        return ObjectHealth(
                            "failed",
                            f"container {container.get('name')} ran out of memory (OOMKilled): raise its "
                            "resources.limits.memory in the chart's values",
                        )
        return None


def _pod_template(obj: Manifest) -> dict[str, Any] | None:
    if obj.get("kind") in WORKLOADS:
        return obj.get("spec", {}).get("template")  # type: ignore[no-any-return]
    return None


class DisruptionBudgetsPlugin(BasePlugin[DisruptionBudgetsConfig]):
    """Contributes :class:`DisruptionBudgets` to Helm installs (opt in: no role enables it by itself)."""

    spec: ClassVar[PluginSpec] = PluginSpec(
        name="disruption_budgets",
        description="example: PodDisruptionBudgets in charts, eviction guards and two health rules",
        config_type=DisruptionBudgetsConfig,
    )

    def setup(self, ctx: SetupContext) -> None:
        ctx.extend(MINISERVICE_EXTENSIONS, DisruptionBudgets(self.config))
