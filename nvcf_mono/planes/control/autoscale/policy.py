"""The policy of one version: its spec's ``autoscalingConfiguration``, else the platform's (reference §6)."""

from __future__ import annotations

from collections.abc import Sequence

from nvcf_mono.models.common import duration_seconds
from nvcf_mono.models.deployment import AutoscalingPolicy, GpuSpec, ScalingDetails
from nvcf_mono.planes.control.autoscale.algorithm import Policy, Stickiness
from nvcf_mono.planes.control.config import AutoscalerSettings


def platform_policy(cfg: AutoscalerSettings) -> Policy:
    return Policy(
        scale_up_threshold=cfg.scale_up_threshold,
        scale_down_threshold=cfg.scale_down_threshold,
        scale_up_factor=cfg.scale_up_factor,
        scale_down_factor=cfg.scale_down_factor,
    )


def version_policy(specs: Sequence[GpuSpec], cfg: AutoscalerSettings) -> Policy:
    """The first spec with a complete, valid custom configuration wins; anything else is the platform's."""
    for spec in specs:
        conf = spec.autoscaling_configuration
        if conf is None or spec.autoscaling_configuration_policy is AutoscalingPolicy.PLATFORM_CONFIGURATION:
            continue
        up, down = conf.scale_up_details, conf.scale_down_details
        if up is None or down is None:
            continue
        if not (up.threshold > down.threshold and up.factor > 1.0 and 0.0 < down.factor < 1.0):
            continue
        return Policy(
            scale_up_threshold=up.threshold,
            scale_down_threshold=down.threshold,
            scale_up_factor=up.factor,
            scale_down_factor=down.factor,
            scale_up_stickiness=_stickiness(up, cfg.sample_step),
            scale_down_stickiness=_stickiness(down, cfg.sample_step),
        )
    return platform_policy(cfg)


def _stickiness(details: ScalingDetails, step: float) -> Stickiness | None:
    """Durations become sample counts (NVCF: minutes, its samples being a minute apart)."""
    if details.stickiness is None:
        return None
    window = int(duration_seconds(details.stickiness.size) // step)
    required = int(duration_seconds(details.stickiness.threshold) // step)
    return Stickiness(window, required) if window > 0 and required > 0 else None
