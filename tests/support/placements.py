"""Ledgers and placed instances for the reconciler's pure planning functions."""

from __future__ import annotations

from typing import Any

from nvcf_mono.models.placement import Phase, PlacedInstance, SpecPlacement

EARLIER = "2026-01-01T10:00:00.000Z"


def placed(instance_id: str, phase: Phase, *, created_at: str = EARLIER, cluster_id: str = "c-1") -> PlacedInstance:
    """An instance of an L40S spec on ``cluster_id``, its request id ``r-<instance_id>``."""
    return PlacedInstance(
        request_id=f"r-{instance_id}",
        cluster_id=cluster_id,
        cluster_name=f"cluster {cluster_id}",
        backend="group",
        region="us-east-1",
        gpu="L40S",
        instance_type="gl40s_1",
        gpu_count=1,
        phase=phase,
        created_at=created_at,
        updated_at=created_at,
        instance_id=instance_id,
    )


def ledger(*instances: PlacedInstance, **fields: Any) -> SpecPlacement:
    """One spec's ledger holding ``instances`` (each one desired, unless ``fields`` say otherwise)."""
    return SpecPlacement(
        **{
            "function_id": "fn-1",
            "function_version_id": "fv-1",
            "deployment_id": "d-1",
            "gpu_specification_id": "g-1",
            "nca_id": "nca",
            "updated_at": EARLIER,
            "instances": instances,
            "desired": len(instances),
            **fields,
        }
    )
