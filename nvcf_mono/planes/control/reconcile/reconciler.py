"""The deployment reconciler: the leader places and terminates instances and drives version status.

Every round works from the mirrors: for each GPU spec it computes the desired count
(``max(minInstances, autoscaler)`` clamped to ``maxInstances``), writes the ledger first (CAS) and
only then publishes creation and termination messages (msg-id = request id, so a republish after
a crash is a duplicate, not a second instance). Status changes follow reference §3.1. A round runs
when any watched bucket changes, and at least every ``reconcile.interval``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import final

import anyio

from nvcf_mono.bus.api import ConnectionState
from nvcf_mono.bus.errors import BusError, ConflictError, NotFound
from nvcf_mono.bus.mirror import Unchanged
from nvcf_mono.contracts import buckets, subjects
from nvcf_mono.contracts.messages import encode
from nvcf_mono.metrics import Metrics
from nvcf_mono.models.cluster import Cluster
from nvcf_mono.models.common import iso, utc_now
from nvcf_mono.models.deployment import Deployment, GpuSpec
from nvcf_mono.models.function import FunctionStatus, FunctionVersion
from nvcf_mono.models.placement import Phase, PlacedInstance, SpecPlacement
from nvcf_mono.planes.control.catalog import Capacity, candidates, is_heard, placeable, visible_clusters
from nvcf_mono.planes.control.context import Control
from nvcf_mono.planes.control.reconcile.ledger import FailurePolicy
from nvcf_mono.planes.control.reconcile.messages import creation_message, termination_message
from nvcf_mono.planes.control.reconcile.plan import Site, Timeouts, expire, lose, scale, terminate_all
from nvcf_mono.planes.control.reconcile.status import SpecState, next_status
from nvcf_mono.planes.control.registry import (
    all_pull_credentials,
    chart_credentials_for,
    pull_credentials_for,
)
from nvcf_mono.planes.control.service import forget_deployment, set_status
from nvcf_mono.planes.control.telemetry import exports_of
from nvcf_mono.structure import evolve

#: A change-triggered round waits at least this many times the last round's duration.
PACING = 2.0


@final
class Reconciler:
    """Runs while its process holds the reconciler lease."""

    def __init__(
        self,
        ctl: Control,
        metrics: Metrics,
        log: logging.Logger,
        *,
        busy: Callable[[str], frozenset[str]] = lambda _: frozenset(),
        serving: Callable[[str], frozenset[str]] = lambda _: frozenset(),
    ) -> None:
        self._ctl = ctl
        self._busy = busy
        self._serving = serving
        #: Since when (monotonic) each cluster has not been heard from, as this leader saw it.
        self._unheard: dict[str, float] = {}
        self._log = log
        cfg = ctl.config.reconcile
        self._timeouts = Timeouts(ack=cfg.ack_timeout, start=cfg.start_timeout, terminate=cfg.terminate_timeout)
        self._policy = FailurePolicy(
            backoff=cfg.retry_backoff, backoff_max=cfg.retry_backoff_max, kept=cfg.failures_kept
        )
        self._rounds = metrics.histogram("nvcf_control_reconcile_seconds", "Duration of one reconcile round.")
        self._created = metrics.counter("nvcf_control_instances_requested_total", "Creation messages published.")
        self._terminated = metrics.counter("nvcf_control_instances_terminated_total", "Termination messages published.")
        self._errors = metrics.counter("nvcf_control_reconcile_errors_total", "Reconcile rounds that failed.")

    async def lead(self) -> None:
        """Reconcile on every change, and at least every interval, until cancelled."""
        signal = self._ctl.wake
        interval = self._ctl.config.reconcile.interval
        self._unheard.clear()  # a new term: what an earlier one did not hear says nothing now
        while True:
            seen = signal.version
            started = time.perf_counter()
            try:
                await self.reconcile_once()
            except BusError as err:
                self._errors.inc()
                self._log.warning("reconcile round failed: %s", err)
            took = time.perf_counter() - started
            self._rounds.observe(took)
            with anyio.move_on_after(interval):
                await signal.wait(after=seen)
            # Let a burst of changes land before the next round, and never spend more than a third of
            # the time reconciling: with thousands of deployments a round is not free, and changes come
            # faster than rounds; what changed meanwhile is seen by the next one.
            await anyio.sleep(max(0.005, PACING * took))

    async def reconcile_once(self) -> None:
        store = self._ctl.store
        now = utc_now()
        clusters = {c.cluster_id: c for c in store.clusters.values()}
        ledgers = dict(store.placements.items())
        capacity = Capacity.from_ledgers(ledgers.values())
        capacity.take_tasks(store.tasks.values(), clusters)  # tasks share the clusters' GPUs
        lost = self._lost_clusters(clusters, ledgers.values())
        seen: set[str] = set()
        for dep in sorted(store.deployments.values(), key=lambda d: (d.created_at, d.deployment_id)):
            fv = store.functions.get(buckets.version_key(dep.function_id, dep.function_version_id))
            if fv is None:
                await self._orphaned(dep)
                continue
            await self._deployment(
                dep, fv=fv, clusters=clusters, ledgers=ledgers, capacity=capacity, seen=seen, now=now, lost=lost
            )
        for key, ledger in ledgers.items():
            if key not in seen:
                await self._retire(key, ledger, clusters, now)

    async def _orphaned(self, dep: Deployment) -> None:
        """A deployment whose version is gone (deleted while it was being deployed) is removed.

        Its instances are retired with every placement no deployment claims. The version is read
        from its bucket first: one made a moment ago may not have reached this node's view yet.
        """
        if await self._ctl.store.functions.fetch(buckets.version_key(dep.function_id, dep.function_version_id)):
            return
        self._log.info(
            "function %s version %s is deleted: its deployment %s is removed",
            dep.function_id,
            dep.function_version_id,
            dep.deployment_id,
        )
        await forget_deployment(self._ctl, dep)

    async def _deployment(
        self,
        dep: Deployment,
        *,
        fv: FunctionVersion,
        clusters: dict[str, Cluster],
        ledgers: dict[str, SpecPlacement],
        capacity: Capacity,
        seen: set[str],
        now: datetime,
        lost: frozenset[str],
    ) -> None:
        store = self._ctl.store
        ttl = self._ctl.config.cluster_heartbeat_ttl
        drained = await self._queue_drained(fv) if dep.undeploying else False
        states: list[SpecState] = []
        limit = self._ctl.config.reconcile.deploy_failure_limit
        mine = visible_clusters(clusters.values(), fv.nca_id)
        for spec in dep.deployment_specifications:
            key = buckets.spec_key(fv.version_id, spec.gpu_specification_id or "")
            seen.add(key)
            original = ledgers.get(key)
            ledger = original or SpecPlacement(
                function_id=fv.id,
                function_version_id=fv.version_id,
                deployment_id=dep.deployment_id,
                gpu_specification_id=spec.gpu_specification_id or "",
                nca_id=fv.nca_id,
                updated_at=iso(now),
            )
            ledger = self._lose(expire(ledger, now, self._timeouts, self._policy), lost, now)
            if fv.status is FunctionStatus.ERROR:
                ledger = terminate_all(ledger, "error", now)
            elif dep.undeploying:
                if drained:
                    ledger = terminate_all(ledger, "undeploy", now)
            elif fv.status is FunctionStatus.DEPLOYING and SpecState(
                min_instances=spec.min_instances, ledger=ledger
            ).failed_out(limit):
                pass  # the version goes to ERROR in this pass: no replacement for a failure that will not pass
            else:
                sites = [
                    Site(cluster=c, instance_type=it, placeable=placeable(c, store.health.get(c.cluster_id), ttl))
                    for c, it in candidates(mine, spec)
                ]
                ledger = scale(
                    ledger,
                    desired=self._desired(spec, key),
                    sites=sites,
                    capacity=capacity,
                    region_of={},
                    now=now,
                    busy=self._busy(fv.version_id),
                    rebalance=self._ctl.config.reconcile.rebalance,
                )
            saved = await self._save(key, original, ledger)
            if saved is not None:
                saved = await self._publish(fv, dep=dep, spec=spec, key=key, ledger=saved, clusters=clusters)
            states.append(SpecState(min_instances=spec.min_instances, ledger=saved or original))
        if dep.undeploying:
            if drained and all(s.ledger is None or not s.ledger.instances for s in states):
                await forget_deployment(self._ctl, dep)
            return
        status = next_status(fv.status, states, failure_limit=limit)
        if status is not fv.status:
            self._log.info("function %s version %s: %s -> %s", fv.id, fv.version_id, fv.status.value, status.value)
            await set_status(self._ctl, fv, status, expected=fv.status)

    def _lost_clusters(self, clusters: dict[str, Cluster], ledgers: Iterable[SpecPlacement]) -> frozenset[str]:
        """Clusters (registered, or holding instances) whose agents have not been heard from for ``lost_after``."""
        cfg = self._ctl.config
        if self._ctl.bus.state is not ConnectionState.CONNECTED:
            # Cut off from the bus, this process hears no cluster: silence counts from the reconnection.
            self._unheard.clear()
            return frozenset()
        placed = {i.cluster_id for ledger in ledgers for i in ledger.instances} | set(clusters)
        now = time.monotonic()
        for cluster_id in placed:
            if is_heard(self._ctl.store.health.get(cluster_id), cfg.cluster_heartbeat_ttl):
                self._unheard.pop(cluster_id, None)
            else:
                self._unheard.setdefault(cluster_id, now)
        for cluster_id in set(self._unheard) - placed:
            del self._unheard[cluster_id]
        return frozenset(c for c, since in self._unheard.items() if now - since >= cfg.reconcile.lost_after)

    def _lose(self, ledger: SpecPlacement, lost_clusters: frozenset[str], now: datetime) -> SpecPlacement:
        if not lost_clusters:
            return ledger
        ledger, lost = lose(ledger, lost_clusters, self._serving(ledger.function_version_id), now)
        for inst in lost:
            self._log.warning(
                "instance %s of function %s version %s is lost with cluster %s (not heard from for %gs): "
                "placing another",
                inst.instance_id or inst.request_id,
                ledger.function_id,
                ledger.function_version_id,
                inst.cluster_name,
                self._ctl.config.reconcile.lost_after,
            )
        return ledger

    def _desired(self, spec: GpuSpec, key: str) -> int:
        target = self._ctl.store.autoscaler.get(key)
        wanted = spec.min_instances if target is None else max(spec.min_instances, target.desired)
        return min(wanted, spec.max_instances)

    async def _retire(self, key: str, ledger: SpecPlacement, clusters: dict[str, Cluster], now: datetime) -> None:
        """A ledger whose spec is gone (undeployed, deleted): terminate everything, then forget it."""
        updated = terminate_all(expire(ledger, now, self._timeouts, self._policy), "undeploy", now)
        if not updated.instances:
            try:
                entry = self._ctl.store.placements.mirror.entry(key)
                if entry is not None:
                    revision = await self._ctl.store.placements.kv.delete(key, revision=entry.revision)
                    self._ctl.store.placements.mirror.note(key, None, revision)
            except ConflictError:
                pass
            return
        saved = await self._save(key, ledger, updated)
        if saved is not None:
            await self._publish(None, dep=None, spec=None, key=key, ledger=saved, clusters=clusters)

    async def _save(self, key: str, original: SpecPlacement | None, ledger: SpecPlacement) -> SpecPlacement | None:
        """Write the ledger if it changed (CAS on the revision it was read at); None if another writer won."""
        if original == ledger:
            return ledger
        table = self._ctl.store.placements
        entry = table.mirror.entry(key)
        try:
            if entry is None:
                revision = await table.kv.create(key, ledger)
            else:
                revision = await table.kv.update(key, ledger, revision=entry.revision)
        except ConflictError:
            self._log.debug("ledger %s changed under us; next round", key)
            return None
        table.mirror.note(key, ledger, revision)
        return ledger

    async def _publish(
        self,
        fv: FunctionVersion | None,
        *,
        dep: Deployment | None,
        spec: GpuSpec | None,
        key: str,
        ledger: SpecPlacement,
        clusters: dict[str, Cluster],
    ) -> SpecPlacement:
        """Send what the ledger says is not sent yet, then record it as sent."""
        creations = [i for i in ledger.instances if i.phase is Phase.REQUESTED and not i.published]
        terminations = [i for i in ledger.instances if i.phase is Phase.TERMINATING and not i.published]
        if not creations and not terminations:
            return ledger
        sent: set[str] = set()
        if creations and fv is not None and dep is not None and spec is not None:
            sent |= await self._send_creations(fv, dep, spec, creations, clusters)
        if terminations:
            sent |= await self._send_terminations(ledger, terminations, clusters)
        if not sent:
            return ledger

        def mark(current: SpecPlacement | None) -> SpecPlacement | None:
            if current is None:
                raise Unchanged
            changed = False
            instances = []
            for inst in current.instances:
                if (
                    inst.request_id in sent
                    and not inst.published
                    and inst.phase in (Phase.REQUESTED, Phase.TERMINATING)
                ):
                    inst = evolve(inst, published=True, attempts=inst.attempts + 1)
                    changed = True
                instances.append(inst)
            if not changed:
                raise Unchanged
            return evolve(current, instances=tuple(instances))

        return await self._ctl.store.placements.mutate(key, mark) or ledger

    async def _send_creations(
        self,
        fv: FunctionVersion,
        dep: Deployment,
        spec: GpuSpec,
        creations: list[PlacedInstance],
        clusters: dict[str, Cluster],
    ) -> set[str]:
        """A creation message per instance to its cluster; the request ids sent."""
        ctl = self._ctl
        sent: set[str] = set()
        stream = ctl.bus.stream(subjects.CREATE_STREAM)
        secrets = any(
            ctl.store.secrets.get(key) is not None
            for key in (buckets.function_secrets_key(fv.id, fv.version_id), buckets.account_secrets_key(fv.nca_id))
        )
        pulls = (
            pull_credentials_for(ctl.store, ctl.keyring, fv.nca_id, fv.container_image)
            if fv.helm_chart is None
            else all_pull_credentials(ctl.store, ctl.keyring, fv.nca_id)
        )
        charts = chart_credentials_for(ctl.store, ctl.keyring, fv.nca_id, fv.helm_chart)
        telemetry = exports_of(ctl.store, ctl.keyring, fv.nca_id, fv.telemetries, ctl.config.telemetry_networks)
        for inst in creations:
            cluster = clusters.get(inst.cluster_id)
            if cluster is None:
                continue
            msg = creation_message(
                fv,
                dep,
                spec,
                inst,
                cluster,
                signer=ctl.tokens,
                link=ctl.worker_link,
                secrets_present=secrets,
                pull_credentials=pulls,
                chart_credentials=charts,
                telemetry=telemetry,
            )
            subject = subjects.create_subject("Function", cluster.cluster_id, inst.gpu, inst.instance_type)
            await stream.publish(subject, encode(msg), msg_id=inst.request_id)
            self._created.inc()
            sent.add(inst.request_id)
        return sent

    async def _send_terminations(
        self, ledger: SpecPlacement, terminations: list[PlacedInstance], clusters: dict[str, Cluster]
    ) -> set[str]:
        """A termination message per instance to its cluster; the request ids sent."""
        sent: set[str] = set()
        stream = self._ctl.bus.stream(subjects.TERMINATE_STREAM)
        for inst in terminations:
            cluster = clusters.get(inst.cluster_id)
            stop = termination_message(
                ledger.nca_id,
                ledger.function_id,
                ledger.function_version_id,
                inst,
                cluster.cluster_name if cluster is not None else inst.cluster_name,
            )
            await stream.publish(
                subjects.terminate_subject(inst.cluster_id), encode(stop), msg_id=f"{inst.request_id}-terminate"
            )
            self._terminated.inc()
            sent.add(inst.request_id)
        return sent

    async def _queue_drained(self, fv: FunctionVersion) -> bool:
        """No request of the version is waiting or being served (or it never had a queue)."""
        region = self._ctl.region
        stream = self._ctl.bus.stream(subjects.request_stream(region, fv.version_id))
        try:
            info = await stream.consumer_info(subjects.worker_durable(region, fv.version_id))
        except NotFound:
            try:
                return (await stream.info()).messages == 0
            except NotFound:
                return True
        return info.num_pending + info.num_ack_pending == 0
