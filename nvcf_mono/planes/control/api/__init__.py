"""The control plane's HTTP API, one module per resource; each declares its ``routes`` at module level."""

from __future__ import annotations

from nvcf_mono.planes.control.api import (
    accounts,
    assets,
    charts,
    clusters,
    deployments,
    functions,
    instances,
    keys,
    queues,
    registry_credentials,
    secrets,
    sharing,
    stats,
    tasks,
    telemetries,
    tokens,
)

ALL = (
    functions,
    deployments,
    accounts,
    keys,
    clusters,
    sharing,
    secrets,
    registry_credentials,
    telemetries,
    assets,
    queues,
    tokens,
    instances,
    tasks,
    charts,
    stats,
)
