"""An autoscaling policy plugin: a version gets as many instances as its requests need, nothing more.

NVCF's algorithm scales on the utilization of worker slots over time, with stickiness. This policy
looks only at the work now: ``ceil((queued + in flight) / requests_per_instance)`` instances, and
none once nothing is queued or in flight and the version has not been invoked for the idle timeout.
It applies to the accounts and functions its configuration names (all when both lists are empty);
every other version keeps NVCF's algorithm.

    plugins:
      queue_policy:
        enabled: true
        requests_per_instance: 4
        accounts: [nvcf-default]
"""

from __future__ import annotations

import math
from typing import ClassVar

import attrs

from nvcf_mono.autoscaling import AUTOSCALING_POLICIES, ScalingDecision, ScalingInputs
from nvcf_mono.plugin import BasePlugin, PluginSpec, SetupContext
from nvcf_mono.structure import positive, setting


@attrs.frozen(kw_only=True)
class QueuePolicyConfig:
    requests_per_instance: int = setting(4, doc="Requests one instance is given, queued or in flight.", check=positive)
    accounts: tuple[str, ...] = setting((), doc="Only these accounts' functions (empty: every account).")
    functions: tuple[str, ...] = setting((), doc="Only these function ids (empty: every function).")


@attrs.frozen
class QueuePolicy:
    """The decision itself: pure, so it is easy to test and cheap to ask every round."""

    config: QueuePolicyConfig
    name: str = "queue_policy"

    def decide(self, inputs: ScalingInputs) -> ScalingDecision | None:
        if self.config.accounts and inputs.nca_id not in self.config.accounts:
            return None
        if self.config.functions and inputs.function_id not in self.config.functions:
            return None
        work = inputs.backlog + inputs.in_flight
        wanted = math.ceil(work / self.config.requests_per_instance)
        if wanted == 0 and inputs.recently_invoked:
            wanted = min(inputs.current, 1)  # invoked lately: keep one warm until the idle timeout
        return ScalingDecision(
            wanted,
            f"{inputs.backlog} queued + {inputs.in_flight} in flight at {self.config.requests_per_instance} each",
        )


class QueuePolicyPlugin(BasePlugin[QueuePolicyConfig]):
    """Contributes :class:`QueuePolicy` to the autoscaler (opt in: no role enables it by itself)."""

    spec: ClassVar[PluginSpec] = PluginSpec(
        name="queue_policy",
        description="example: scale function versions by their queue alone",
        config_type=QueuePolicyConfig,
        requires=("control",),
    )

    def setup(self, ctx: SetupContext) -> None:
        ctx.extend(AUTOSCALING_POLICIES, QueuePolicy(self.config))
