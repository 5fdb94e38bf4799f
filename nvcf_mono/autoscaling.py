"""The autoscaling policy extension point: a plugin decides how many instances a function version wants.

Contribute an :class:`AutoscalingPolicy` to :data:`AUTOSCALING_POLICIES` in a plugin's ``setup()``.
Each autoscaler round (on the control plane's leader) asks the policies, in plugin start order, for
each deployed version; the first that answers decides, and a policy answers ``None`` for what it
does not handle (so one policy can serve one function, one account, or all). When none answers,
NVCF's algorithm decides, as without plugins. Whatever a policy wants, the platform still keeps the
deployment's ``minInstances`` and ``maxInstances`` and never removes an instance that is starting or
serving a request. A policy that raises is logged and NVCF's algorithm decides that round.
"""

from __future__ import annotations

from typing import Protocol

import attrs

from nvcf_mono.services import ExtensionPoint


@attrs.frozen(kw_only=True)
class ScalingInputs:
    """What the autoscaler knows of one function version this round."""

    function_id: str
    function_version_id: str
    function_name: str
    #: The account that owns the function.
    nca_id: str
    #: Instances whose workers are connected and ready.
    current: int
    #: Instances placed and not running yet.
    starting: int
    #: Requests being served now, over all instances.
    in_flight: int
    #: Requests stored and not yet handed to an instance.
    backlog: int
    #: How many requests one instance serves at once (maxRequestConcurrency).
    slots_per_instance: int
    #: Utilization of the worker slots in percent, one sample per step, oldest first.
    utilization: tuple[float, ...]
    #: Invoked within the idle timeout.
    recently_invoked: bool
    #: The deployment's limits, summed over its GPU specifications.
    min_instances: int
    max_instances: int


@attrs.frozen
class ScalingDecision:
    """How many instances the version wants, and why (shown as the autoscaler's last decision)."""

    desired: int
    reason: str


class AutoscalingPolicy(Protocol):
    """Decides a version's instance count; ``None`` leaves it to the next policy or NVCF's algorithm."""

    @property
    def name(self) -> str:
        """Shown in the autoscaler's reason (``policy <name>: ...``) and its log."""
        ...

    def decide(self, inputs: ScalingInputs) -> ScalingDecision | None: ...


AUTOSCALING_POLICIES: ExtensionPoint[AutoscalingPolicy] = ExtensionPoint("nvcf_mono.autoscaling.policies")
