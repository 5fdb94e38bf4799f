"""Which function version a request goes to, from watch-fed copies of the control plane's buckets.

No KV read happens per request: functions, deployments, sharing and placement ledgers are
mirrored and indexed by function id.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from typing import final

import anyio
from anyio.abc import TaskStatus

from nvcf_mono.auth.principal import Principal
from nvcf_mono.bus.api import Bus
from nvcf_mono.bus.mirror import CATCH_UP, KvMirror, Signal
from nvcf_mono.contracts import buckets
from nvcf_mono.http.problem import ProblemError
from nvcf_mono.models.deployment import Deployment
from nvcf_mono.models.function import AWAITING_INSTANCES, CONNECTABLE, INVOCABLE, FunctionStatus, FunctionVersion
from nvcf_mono.models.placement import SpecPlacement
from nvcf_mono.models.sharing import AuthorizedParties


@final
class RoutingTable:
    """Function versions, deployments, sharing and placements, kept current by watches."""

    def __init__(self, bus: Bus, log: logging.Logger) -> None:
        self.changed = Signal()
        self.functions = KvMirror(bus.kv(buckets.FUNCTIONS.name), buckets.FUNCTION, signal=self.changed, log=log)
        self.deployments = KvMirror(bus.kv(buckets.DEPLOYMENTS.name), buckets.DEPLOYMENT, signal=self.changed, log=log)
        self.sharing = KvMirror(
            bus.kv(buckets.AUTHORIZATIONS.name), buckets.AUTHORIZED_PARTIES, signal=self.changed, log=log
        )
        self.placements = KvMirror(bus.kv(buckets.PLACEMENTS.name), buckets.PLACEMENT, signal=self.changed, log=log)
        self._by_version: dict[str, FunctionVersion] = {}
        self._seen = -1

    async def run(self, bus: Bus, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        async with anyio.create_task_group() as tg:
            for mirror in (self.functions, self.deployments, self.sharing, self.placements):
                await tg.start(mirror.run, bus)
            task_status.started()

    def versions_of(self, function_id: str) -> list[FunctionVersion]:
        """The function's versions (none when unknown)."""
        return self.functions.group(function_id)

    def version(self, function_id: str, version_id: str) -> FunctionVersion | None:
        return self.functions.get(buckets.version_key(function_id, version_id))

    def version_by_id(self, version_id: str) -> FunctionVersion | None:
        # Rebuilt when the functions change, not on every placement or deployment update.
        if self._seen != self.functions.generation:
            self._seen = self.functions.generation
            self._by_version = {fv.version_id: fv for fv in self.functions.values()}
        return self._by_version.get(version_id)

    def account_of(self, version_id: str) -> str | None:
        """The account whose function version this is (None for one not known here)."""
        fv = self.version_by_id(version_id)
        return None if fv is None else fv.nca_id

    def deployment(self, fv: FunctionVersion) -> Deployment | None:
        return self.deployments.get(buckets.version_key(fv.id, fv.version_id))

    def placements_of(self, fv: FunctionVersion) -> list[SpecPlacement]:
        return self.placements_by_ids(fv.id, fv.version_id)

    def placements_by_ids(self, function_id: str, version_id: str) -> list[SpecPlacement]:
        return self.placements.group(version_id)

    def _shared(self, fv: FunctionVersion, account: str) -> bool:
        for key in (fv.id, f"{fv.id}.{fv.version_id}"):
            parties: AuthorizedParties | None = self.sharing.get(key)
            if parties is not None and any(p.nca_id in (account, "*") for p in parties.authorized_parties):
                return True
        return False

    def may_invoke(self, principal: Principal, fv: FunctionVersion) -> bool:
        """Own account's or shared with it, and (for API keys) among the key's resources."""
        own = fv.nca_id == principal.account
        if not own and not self._shared(fv, principal.account):
            return False
        res = principal.resources
        return res is None or res.allows_function(fv.id, fv.version_id, own_account=own)

    def resolve(self, principal: Principal, function_id: str, version_id: str | None) -> FunctionVersion:
        """The version to invoke: the pinned one, or any ACTIVE/DEGRADING one at random."""
        candidates: Sequence[FunctionVersion]
        if version_id is not None:
            fv = self.version(function_id, version_id)
            candidates = [] if fv is None else [fv]
        else:
            candidates = self.versions_of(function_id)
        visible = [fv for fv in candidates if self.may_invoke(principal, fv)]
        if not visible:
            if candidates and any(fv.nca_id == principal.account for fv in candidates):
                raise ProblemError(403, "the API key does not grant access to this function")
            pinned = "" if version_id is None else f" version '{version_id}'"
            raise ProblemError(404, f"function '{function_id}'{pinned} not found")
        ready = [fv for fv in visible if fv.status in INVOCABLE]
        if ready:
            return random.choice(ready)
        # No instance ready is a reason to wait, not the caller's error: the request is queued, and
        # served once one is (or answered by the poll window and the queue deadline as usual).
        waiting = [fv for fv in visible if fv.status in AWAITING_INSTANCES]
        if waiting:
            return random.choice(waiting)
        failed = [fv for fv in visible if fv.status is FunctionStatus.ERROR]
        if failed:
            raise ProblemError(503, self._error_detail(failed[0], owner=failed[0].nca_id == principal.account))
        raise ProblemError(404, f"function '{function_id}' is not deployed")

    def _error_detail(self, fv: FunctionVersion, *, owner: bool) -> str:
        """Why: the last failure's cause; its log excerpt only for the owner (a shared function's callers)."""
        failures = sorted((f for p in self.placements_of(fv) for f in p.failures), key=lambda f: f.at)
        last = failures[-1] if failures else None
        why = ""
        if last is not None:
            why = f" (last failure: {last.cause}: {last.error})" if owner and last.error else f" ({last.cause})"
        return (
            f"the function's deployment is in ERROR{why}; no instance will start until it is undeployed and "
            "deployed again"
        )

    async def resolve_current(
        self, principal: Principal, function_id: str, version_id: str | None, *, patience: float = CATCH_UP
    ) -> FunctionVersion:
        """:meth:`resolve`, sure of a "no": a version deployed a moment ago is found, not refused with a 404.

        The copies follow the buckets by a moment; before a refusal the copies catch up with every write
        made until now (one call per bucket, only on this path) and the version is looked up again.
        """
        try:
            return self.resolve(principal, function_id, version_id)
        except ProblemError as err:
            if err.status not in (403, 404):
                raise
            mirrors = (self.functions, self.deployments, self.sharing)
            results = [False] * len(mirrors)

            async def catch_up(i: int) -> None:
                results[i] = await mirrors[i].caught_up(patience)

            async with anyio.create_task_group() as tg:
                for i in range(len(mirrors)):
                    tg.start_soon(catch_up, i)
            if not any(results):
                raise
        return self.resolve(principal, function_id, version_id)

    def connectable(self, function_id: str, version_id: str) -> bool:
        """May a worker of this version connect (it is deployed)?"""
        fv = self.version(function_id, version_id)
        return fv is not None and fv.status in CONNECTABLE
