"""The function-version state machine of reference control-plane §3.1, from what the ledgers say."""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from nvcf_mono.models.function import FunctionStatus
from nvcf_mono.models.placement import Phase, SpecPlacement


@attrs.frozen(kw_only=True)
class SpecState:
    """One spec's minimum and its ledger (None before anything was placed)."""

    min_instances: int
    ledger: SpecPlacement | None

    @property
    def ready(self) -> int:
        return 0 if self.ledger is None else sum(1 for i in self.ledger.instances if i.phase is Phase.RUNNING)

    def failed_out(self, limit: int) -> bool:
        """Nothing serves and the failures say more attempts will not help."""
        if self.min_instances == 0 or self.ledger is None or self.ready > 0:
            return False
        permanent = any(f.permanent for f in self.ledger.failures)
        return permanent or self.ledger.total_failures >= limit


def next_status(current: FunctionStatus, specs: Sequence[SpecState], *, failure_limit: int) -> FunctionStatus:
    """Where a deployed version goes next; INACTIVE and ERROR stay (ERROR is sticky until undeployed)."""
    if current in (FunctionStatus.INACTIVE, FunctionStatus.ERROR, FunctionStatus.DELETED):
        return current
    all_met = all(s.ready >= s.min_instances for s in specs)
    if current is FunctionStatus.DEPLOYING:
        if all_met:
            return FunctionStatus.ACTIVE
        if any(s.failed_out(failure_limit) for s in specs):
            return FunctionStatus.ERROR
        return FunctionStatus.DEPLOYING
    if all_met:
        return FunctionStatus.ACTIVE
    if sum(s.ready for s in specs) == 0:
        return FunctionStatus.DEGRADED
    return FunctionStatus.DEGRADING
