"""The control plane's ledger of instance requests per GPU spec (bucket ``nvcf_placements``).

The ledger is written before a creation message is published, so every creation message has an
entry, and a second control-plane process (or a new leader) sees exactly what was asked for.
"""

from __future__ import annotations

import enum

from nvcf_mono.structure import WireModel, wire


class Phase(enum.Enum):
    """Where one instance request stands."""

    REQUESTED = "requested"  # in the ledger; the creation message is (being) published
    ACKNOWLEDGED = "acknowledged"  # the agent has the request
    STARTING = "starting"
    RUNNING = "running"
    TERMINATING = "terminating"  # a termination message is (being) published


LIVE = frozenset({Phase.REQUESTED, Phase.ACKNOWLEDGED, Phase.STARTING, Phase.RUNNING})


@wire
class PlacedInstance(WireModel):
    """One instance request (one creation message, one instance)."""

    request_id: str
    cluster_id: str
    cluster_name: str
    backend: str
    region: str
    gpu: str
    instance_type: str
    gpu_count: int
    phase: Phase
    created_at: str
    updated_at: str
    instance_id: str | None = None
    ready_at: str | None = None
    #: The agent's last ``instanceState`` (``starting``, ``running``, ...).
    instance_state: str | None = None
    #: Why it is being terminated (``scale-down``, ``undeploy``, ``lost``, ...).
    termination_reason: str | None = None
    #: True once the creation (or termination) message is stored in its stream.
    published: bool = False
    #: The creation message's publish count (retries after an unclear publish).
    attempts: int = 0
    #: Rebalancing or a rollover: the instance (request id) this one replaces once it runs.
    replaces: str | None = None
    #: A rollover (``rolloverWorkers``) asked for this instance to be replaced by a new one.
    rollover: bool = False


@wire
class PlacementFailure(WireModel):
    """A failed instance, kept for ``healthInfo`` and ``instance_failing``."""

    request_id: str
    cluster_id: str
    backend: str
    gpu: str
    instance_type: str
    cause: str
    error: str
    at: str
    instance_id: str | None = None
    #: Causes no retry can fix (the image cannot run): the deployment fails without more attempts.
    permanent: bool = False


@wire
class SpecPlacement(WireModel):
    """Instance requests of one GPU spec of one deployment."""

    function_id: str
    function_version_id: str
    deployment_id: str
    gpu_specification_id: str
    nca_id: str
    updated_at: str
    instances: tuple[PlacedInstance, ...] = ()
    failures: tuple[PlacementFailure, ...] = ()
    total_failures: int = 0
    consecutive_failures: int = 0
    #: No new placement before this time (backoff after failures).
    retry_after: str | None = None
    #: Instances wanted but not placed, and why (``no cluster has capacity ...``).
    waiting: int = 0
    waiting_reason: str | None = None
    #: The desired count the reconciler last acted on.
    desired: int = 0

    def live(self) -> tuple[PlacedInstance, ...]:
        return tuple(i for i in self.instances if i.phase in LIVE)

    def find(self, request_id: str) -> PlacedInstance | None:
        for inst in self.instances:
            if inst.request_id == request_id:
                return inst
        return None
