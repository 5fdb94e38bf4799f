"""Pure transitions of a spec's ledger on what agents report (acks and instance status)."""

from __future__ import annotations

from datetime import datetime, timedelta

import attrs

from nvcf_mono.contracts import states
from nvcf_mono.contracts.messages import InstanceStatusReport
from nvcf_mono.models.common import iso
from nvcf_mono.models.placement import Phase, PlacedInstance, PlacementFailure, SpecPlacement
from nvcf_mono.structure import evolve


@attrs.frozen(kw_only=True)
class FailurePolicy:
    """How failures are remembered and how long replacements wait."""

    backoff: float = 2.0
    backoff_max: float = 300.0
    kept: int = 10

    def delay(self, consecutive: int) -> float:
        return float(min(self.backoff * 2 ** max(consecutive - 1, 0), self.backoff_max))


def replace_instance(ledger: SpecPlacement, updated: PlacedInstance) -> SpecPlacement:
    return evolve(
        ledger, instances=tuple(updated if i.request_id == updated.request_id else i for i in ledger.instances)
    )


def remove_instance(ledger: SpecPlacement, request_id: str) -> SpecPlacement:
    return evolve(ledger, instances=tuple(i for i in ledger.instances if i.request_id != request_id))


def record_failure(
    ledger: SpecPlacement,
    inst: PlacedInstance,
    *,
    cause: str,
    error: str,
    now: datetime,
    policy: FailurePolicy,
) -> SpecPlacement:
    """Forget the instance, remember why it failed, and back off before replacing it."""
    failure = PlacementFailure(
        request_id=inst.request_id,
        cluster_id=inst.cluster_id,
        backend=inst.backend,
        gpu=inst.gpu,
        instance_type=inst.instance_type,
        instance_id=inst.instance_id,
        cause=cause,
        error=error[-1024:],
        at=iso(now),
        permanent=cause in states.PERMANENT_CAUSES,
    )
    consecutive = ledger.consecutive_failures + 1
    return evolve(
        remove_instance(ledger, inst.request_id),
        failures=(*ledger.failures, failure)[-policy.kept :],
        total_failures=ledger.total_failures + 1,
        consecutive_failures=consecutive,
        retry_after=iso(now + timedelta(seconds=policy.delay(consecutive))),
        updated_at=iso(now),
    )


def apply_ack(ledger: SpecPlacement, request_id: str, now: datetime) -> SpecPlacement | None:
    """The agent holds the request; None when the ledger does not know it (the agent should drop it)."""
    inst = ledger.find(request_id)
    if inst is None or inst.phase is Phase.TERMINATING:
        return None
    if inst.phase is not Phase.REQUESTED:
        return ledger
    return replace_instance(ledger, evolve(inst, phase=Phase.ACKNOWLEDGED, published=True, updated_at=iso(now)))


def apply_report(
    ledger: SpecPlacement, report: InstanceStatusReport, now: datetime, policy: FailurePolicy
) -> SpecPlacement | None:
    """Apply one instance status report; None when the request is unknown here."""
    inst = ledger.find(report.request_id)
    if inst is None:
        return None
    state = report.instance_state
    stamp = iso(now)
    if state in states.GONE_STATES or report.request_state.value == "closed":
        if inst.phase is Phase.TERMINATING or report.status == states.TERMINATED_BY_USER or _not_its_fault(report):
            return evolve(remove_instance(ledger, inst.request_id), updated_at=stamp)
        cause = report.termination_cause or (state if state != states.TERMINATED else report.status)
        error = report.health_info.error_log if report.health_info is not None else ""
        return record_failure(ledger, inst, cause=cause, error=error, now=now, policy=policy)
    if inst.phase is Phase.TERMINATING:
        return ledger  # still stopping; wait for the terminated report
    if state == states.RUNNING:
        if inst.phase is Phase.RUNNING and inst.instance_id == report.instance_id:
            return ledger
        updated = evolve(
            inst,
            phase=Phase.RUNNING,
            instance_id=report.instance_id,
            instance_state=state,
            ready_at=inst.ready_at or stamp,
            published=True,
            updated_at=stamp,
        )
        return evolve(replace_instance(ledger, updated), consecutive_failures=0, retry_after=None, updated_at=stamp)
    if state == states.SHUTTING_DOWN:
        return replace_instance(ledger, evolve(inst, instance_state=state, updated_at=stamp))
    # starting, or anything else not terminal: the instance exists but does not serve (yet, or any more)
    if inst.phase is Phase.STARTING and inst.instance_id == report.instance_id and inst.instance_state == state:
        return ledger
    return replace_instance(
        ledger,
        evolve(
            inst,
            phase=Phase.STARTING,
            instance_id=report.instance_id,
            instance_state=state,
            published=True,
            updated_at=stamp,
        ),
    )


def _not_its_fault(report: InstanceStatusReport) -> bool:
    """Stopped with its node (the platform shut down, a cluster's maintenance): replaced as any ended
    instance is, but no failure of the function's, so neither counted, listed nor backed off.
    """
    return report.termination_cause == states.SERVICE_MAINTENANCE
