"""The autoscaler: each round, per ACTIVE version, NVCF's decision plus the queue, written as targets.

Runs under the reconciler's lease, in the same process as the reconciler, which places what the
targets ask for (``max(minInstances, target)`` clamped to ``maxInstances`` per spec). Inputs are
measured by the platform: utilization from the invocation nodes' load reports, current workers,
in-flight work, queue depth from the version's consumer, and invocation recency. A wake (a request
queued at zero running instances) raises the version to one instance at once.

Safety: the target never drops below the instances still starting plus those with work in flight,
and the reconciler reaps idle running instances first, so scaling down never kills work; workers
drain what they hold when terminated.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import final

import anyio
import attrs

from nvcf_mono.autoscaling import AutoscalingPolicy, ScalingInputs
from nvcf_mono.bus.errors import BusError, ConflictError
from nvcf_mono.bus.mirror import Unchanged
from nvcf_mono.contracts import buckets, load, streams
from nvcf_mono.contracts.messages import MessageError, decode
from nvcf_mono.metrics import Metrics
from nvcf_mono.models.common import iso, parse_iso, utc_now
from nvcf_mono.models.deployment import Deployment
from nvcf_mono.models.function import FunctionStatus, FunctionVersion
from nvcf_mono.models.placement import LIVE, Phase, SpecPlacement
from nvcf_mono.planes.control.autoscale.algorithm import Estimate, decide, distribute, sanitize, with_backlog
from nvcf_mono.planes.control.autoscale.observations import LoadBook
from nvcf_mono.planes.control.autoscale.policy import version_policy
from nvcf_mono.planes.control.context import Control

#: Persist "last invoked" at most this often when nothing else changes (for the next leader).
RECENCY_PERSIST = 60.0
COLD_START_BUCKETS = (0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600)


@attrs.frozen(kw_only=True)
class Inputs:
    """What one version's decision was made from."""

    current: int
    starting: int
    busy_instances: int
    in_flight: int
    backlog: int
    slots_per_instance: int
    samples: tuple[float, ...]
    recently_invoked: bool


@final
class Autoscaler:
    """Decides while leader; every control-plane process keeps the load book."""

    def __init__(
        self,
        ctl: Control,
        book: LoadBook,
        metrics: Metrics,
        log: logging.Logger,
        policies: Sequence[AutoscalingPolicy] = (),
    ) -> None:
        self._ctl = ctl
        #: Plugins' policies, asked before NVCF's algorithm (nvcf_mono/autoscaling.py).
        self._policies = tuple(policies)
        self._book = book
        self._log = log
        self._cfg = ctl.config.autoscaler
        #: Per version: the total last written (the stale-zero guard's ``last_predicted``).
        self._last: dict[str, int] = {}
        #: Per version: when scaling from zero began (for the cold-start histogram).
        self._cold: dict[str, float] = {}
        #: Per version: requests queued or being served, read for all versions once per round.
        self._depths: dict[str, int] = {}
        #: Per version: the labels its gauges carry (removed when it stops being scaled).
        self._labelled: dict[str, dict[str, str]] = {}
        labels = ["function_id", "function_version_id"]
        self._desired = metrics.gauge("nvcf_autoscaler_scaling_desired_instances", "Desired instances.", labels)
        self._current = metrics.gauge(
            "nvcf_autoscaler_scaling_current_instances", "Workers connected and ready.", labels
        )
        self._starting = metrics.gauge(
            "nvcf_autoscaler_scaling_starting_instances", "Instances placed and not running yet.", labels
        )
        self._utilization = metrics.gauge(
            "nvcf_autoscaler_scaling_utilization", "Weighted average utilization of worker slots (percent).", labels
        )
        self._queue = metrics.gauge(
            "nvcf_autoscaler_queue_depth", "Requests waiting or being served (consumer pending + unacked).", labels
        )
        self._decisions = metrics.counter(
            "nvcf_autoscaler_decisions_total", "Changes of a version's desired instances, by kind.", [*labels, "kind"]
        )
        self._cold_start = metrics.histogram(
            "nvcf_autoscaler_cold_start_seconds",
            "From the decision to scale a version up from zero to its first connected worker.",
            labels,
            buckets=COLD_START_BUCKETS,
        )

    # ---- the book (every process) ------------------------------------------------------------------

    async def listen(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Record every load report (all control-plane processes, so a new leader has the history)."""
        async with self._ctl.bus.subscribe(load.LOAD_ALL, max_pending=10_000) as sub:
            task_status.started()
            async for msg in sub:
                try:
                    report = decode(load.LoadReport, msg.data)
                except MessageError as err:
                    self._log.warning("ignoring a malformed load report on %s: %s", msg.subject, err)
                    continue
                now = time.monotonic()
                self._book.record(report, now)
                self._ctl.traffic.record(report)
                for v in report.versions:
                    started = self._cold.get(v.function_version_id)
                    if started is not None and any(i.ready for i in v.instances):
                        del self._cold[v.function_version_id]
                        self._cold_start.observe(
                            now - started, function_id=v.function_id, function_version_id=v.function_version_id
                        )

    # ---- deciding (the leader) ---------------------------------------------------------------------

    async def lead(self) -> None:
        """Wakes and rounds until the lease is lost."""
        if not self._cfg.enabled:
            await anyio.sleep_forever()
        self._restore()
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._wakes)
            while True:
                try:
                    await self.round()
                except BusError as err:
                    self._log.warning("autoscaler round failed: %s", err)
                await anyio.sleep(self._cfg.interval)

    def _restore(self) -> None:
        """What the previous leader knew: last totals and when versions were last invoked."""
        now, wall = time.monotonic(), utc_now()
        for key, target in self._ctl.store.autoscaler.items():
            fvid = key.split(".", 1)[0]
            self._last[fvid] = self._last.get(fvid, 0) + target.desired
            if target.last_invoked_at is not None:
                ago = (wall - parse_iso(target.last_invoked_at)).total_seconds()
                book = self._book.version(fvid)
                at = now - max(ago, 0.0)
                if book.last_invoked is None or book.last_invoked < at:
                    book.last_invoked = at

    async def _wakes(self) -> None:
        async with self._ctl.bus.subscribe(load.WAKE_ALL) as sub:
            async for msg in sub:
                fvid = msg.subject.rsplit(".", 1)[-1]
                self._book.invoked(fvid, time.monotonic())
                found = self._find(fvid)
                if found is None:
                    continue
                fv, dep = found
                ledgers = self._ledgers(fv, dep)
                if fv.status is not FunctionStatus.ACTIVE or any(p.live() for p in ledgers if p is not None):
                    continue
                try:
                    await self._apply(fv, dep, 1, "wake", "a request is waiting and no instance is running")
                except BusError as err:
                    self._log.warning("wake of %s not applied (the next round retries): %s", fvid, err)

    async def round(self) -> None:
        store = self._ctl.store
        active = set()
        with anyio.move_on_after(self._cfg.interval * 4):
            # Unknown this round (a bus this slow): the last known depths stand in.
            self._depths = await streams.queue_depths(self._ctl.bus, self._ctl.region)
        deployed = {dep.function_version_id for dep in store.deployments.values()}
        for key in [k for k, _ in store.autoscaler.items() if k.split(".", 1)[0] not in deployed]:
            # Undeployed: a later deployment of the version starts from its minInstances, not from this.
            await store.autoscaler.mutate(key, lambda _: None)
        for dep in list(store.deployments.values()):
            fv = store.functions.get(buckets.version_key(dep.function_id, dep.function_version_id))
            if fv is None or dep.undeploying or fv.status is not FunctionStatus.ACTIVE:
                continue
            active.add(fv.version_id)
            await self._version(fv, dep)
        for fvid in [v for v in self._last if v not in active]:
            self._last.pop(fvid, None)
            self._cold.pop(fvid, None)
        for fvid in [v for v in self._labelled if v not in active]:
            # Series of versions no longer scaled go: /metrics grows with what runs, not with history.
            labels = self._labelled.pop(fvid)
            for series in (
                self._desired,
                self._current,
                self._starting,
                self._utilization,
                self._queue,
                self._decisions,
                self._cold_start,
            ):
                series.forget(**labels)

    async def _version(self, fv: FunctionVersion, dep: Deployment) -> None:
        inputs = await self._inputs(fv, dep)
        if self._policies and await self._by_plugin(fv, dep, inputs):
            return
        policy = version_policy(dep.deployment_specifications, self._cfg)
        last = self._last.get(fv.version_id, 0)
        if inputs.current == 0 and inputs.starting == 0:
            last = 0  # nothing is on its way: the stale-zero guard has nothing to wait for
        estimate = decide(
            inputs.samples,
            policy,
            current=inputs.current,
            recently_invoked=inputs.recently_invoked,
            last_predicted=last,
            decay=self._cfg.decay_factor,
        )
        labels = self._labels(fv)
        self._current.set(inputs.current, **labels)
        self._starting.set(inputs.starting, **labels)
        self._queue.set(inputs.backlog, **labels)
        floor = inputs.starting + inputs.busy_instances
        if estimate is None:
            # Instances asked for have not reported yet: no utilization decision, but a queue that
            # outgrows what is coming still asks for more (the guard only stops decisions against it).
            queued = with_backlog(
                0, backlog=inputs.backlog, slots_per_instance=inputs.slots_per_instance, in_flight=inputs.in_flight
            )
            if queued > last:
                await self._apply(fv, dep, max(queued, floor), "queue", _queue_reason(inputs))
            return
        self._utilization.set(round(estimate.average, 3), **labels)
        wanted = with_backlog(
            estimate.desired,
            backlog=inputs.backlog,
            slots_per_instance=inputs.slots_per_instance,
            in_flight=inputs.in_flight,
        )
        desired = max(wanted, floor)
        kind, why = _explain(
            estimate, wanted, desired, inputs, up=policy.scale_up_threshold, down=policy.scale_down_threshold
        )
        await self._apply(fv, dep, desired, kind, why)

    async def _by_plugin(self, fv: FunctionVersion, dep: Deployment, inputs: Inputs) -> bool:
        """Let the first plugin policy that answers decide; False when none does."""
        specs = dep.deployment_specifications
        asked = ScalingInputs(
            function_id=fv.id,
            function_version_id=fv.version_id,
            function_name=fv.name,
            nca_id=fv.nca_id,
            current=inputs.current,
            starting=inputs.starting,
            in_flight=inputs.in_flight,
            backlog=inputs.backlog,
            slots_per_instance=inputs.slots_per_instance,
            utilization=inputs.samples,
            recently_invoked=inputs.recently_invoked,
            min_instances=sum(s.min_instances for s in specs),
            max_instances=sum(s.max_instances for s in specs),
        )
        for policy in self._policies:
            try:
                decision = policy.decide(asked)
            except Exception:
                self._log.exception("autoscaling policy %r failed for version %s", policy.name, fv.version_id)
                return False  # NVCF's algorithm decides this round
            if decision is None:
                continue
            labels = self._labels(fv)
            self._current.set(inputs.current, **labels)
            self._starting.set(inputs.starting, **labels)
            self._queue.set(inputs.backlog, **labels)
            # Never below what is starting or serving: a policy cannot cut an instance mid-request.
            desired = max(int(decision.desired), inputs.starting + inputs.busy_instances, 0)
            await self._apply(fv, dep, desired, "plugin", f"policy {policy.name}: {decision.reason}")
            return True
        return False

    async def _inputs(self, fv: FunctionVersion, dep: Deployment) -> Inputs:
        now = time.monotonic()
        cfg = self._cfg
        book = self._book.version(fv.version_id)
        workers = book.connected(now, cfg.worker_stale)
        ready = [w for w in workers.values() if w.ready]
        starting = sum(
            1
            for p in self._ledgers(fv, dep)
            if p is not None
            for i in p.instances
            if i.phase in LIVE and i.phase is not Phase.RUNNING
        )
        raw = book.samples(now, step=cfg.sample_step, lookback=cfg.lookback, window=cfg.utilization_window)
        slots = next((s.max_request_concurrency for s in dep.deployment_specifications if s.max_request_concurrency), 1)
        return Inputs(
            current=len(ready),
            starting=starting,
            busy_instances=sum(1 for w in workers.values() if w.in_flight > 0),
            in_flight=sum(w.in_flight for w in workers.values()),
            backlog=self._depths.get(fv.version_id, 0),
            slots_per_instance=slots,
            samples=tuple(sanitize(enumerate(raw))),
            recently_invoked=book.last_invoked is not None and now - book.last_invoked < cfg.idle_timeout,
        )

    async def _apply(self, fv: FunctionVersion, dep: Deployment, total: int, kind: str, why: str) -> None:
        """Clamp to the specs' limits, spread over the specs, write what changed."""
        specs = dep.deployment_specifications
        low = sum(s.min_instances for s in specs)
        high = sum(s.max_instances for s in specs)
        wanted, total = total, min(max(total, low), high)
        if total > wanted:
            why += f"; minInstances keep {total}"
        elif total < wanted:
            why += f"; maxInstances cap it at {total} (wanted {wanted})"
        counts = distribute(total, [(s.min_instances, s.max_instances) for s in specs])
        book = self._book.version(fv.version_id)
        now, wall = time.monotonic(), utc_now()
        invoked_at = None if book.last_invoked is None else iso(wall - timedelta(seconds=now - book.last_invoked))
        previous = self._last.get(fv.version_id)
        live = sum(len(p.live()) for p in self._ledgers(fv, dep) if p is not None)
        if total > 0 and live == 0 and fv.version_id not in self._cold:
            self._cold[fv.version_id] = now
        changed = False
        for spec, count in zip(specs, counts, strict=True):
            key = buckets.spec_key(fv.version_id, spec.gpu_specification_id or "")
            target = buckets.AutoscalerTarget(desired=count, reason=why, at=iso(wall), last_invoked_at=invoked_at)
            changed |= await self._write(key, target)
        self._last[fv.version_id] = total
        self._desired.set(total, **self._labels(fv))
        if changed and previous != total:
            self._decisions.inc(1.0, kind=kind, **self._labels(fv))
            self._log.info(
                "function %s version %s: %s -> %d instance(s): %s", fv.id, fv.version_id, previous, total, why
            )

    async def _write(self, key: str, target: buckets.AutoscalerTarget) -> bool:
        """Write a target whose count changed, or whose recency is worth keeping for the next leader."""

        def stale(current: buckets.AutoscalerTarget | None) -> bool:
            return current is None or current.desired != target.desired or _recency_moved(current, target)

        if not stale(self._ctl.store.autoscaler.get(key)):  # the mirror: no bus call for a steady version
            return False
        wrote = False

        def update(current: buckets.AutoscalerTarget | None) -> buckets.AutoscalerTarget:
            nonlocal wrote
            if not stale(current):
                raise Unchanged
            wrote = True
            return target

        try:
            await self._ctl.store.autoscaler.mutate(key, update)
        except ConflictError:
            return False
        return wrote

    def _labels(self, fv: FunctionVersion) -> dict[str, str]:
        return self._labelled.setdefault(fv.version_id, {"function_id": fv.id, "function_version_id": fv.version_id})

    def _find(self, fvid: str) -> tuple[FunctionVersion, Deployment] | None:
        store = self._ctl.store
        for dep in store.deployments.values():
            if dep.function_version_id == fvid and not dep.undeploying:
                fv = store.functions.get(buckets.version_key(dep.function_id, fvid))
                if fv is not None:
                    return fv, dep
        return None

    def _ledgers(self, fv: FunctionVersion, dep: Deployment) -> list[SpecPlacement | None]:
        placements = self._ctl.store.placements
        return [
            placements.get(buckets.spec_key(fv.version_id, s.gpu_specification_id or ""))
            for s in dep.deployment_specifications
        ]


def _recency_moved(current: buckets.AutoscalerTarget, target: buckets.AutoscalerTarget) -> bool:
    if target.last_invoked_at is None:
        return False
    if current.last_invoked_at is None:
        return True
    moved = parse_iso(target.last_invoked_at) - parse_iso(current.last_invoked_at)
    return moved.total_seconds() >= RECENCY_PERSIST


def _queue_reason(inputs: Inputs) -> str:
    return f"{inputs.backlog} request(s) queued or running for {inputs.slots_per_instance} slot(s) per instance"


def _explain(
    estimate: Estimate, wanted: int, desired: int, inputs: Inputs, *, up: float, down: float
) -> tuple[str, str]:
    """A decision kind (for the metric) and a sentence for ``deploy get``."""
    util = f"utilization {estimate.average:.0f}%"
    newest = inputs.samples[-1] if inputs.samples else 0.0
    if desired > wanted:
        return "hold", (
            f"held at {desired}: {inputs.starting} instance(s) starting and {inputs.busy_instances} with work in "
            "flight are never reaped"
        )
    if wanted > estimate.desired:
        return "queue", _queue_reason(inputs)
    if estimate.desired == 0:
        return "zero", f"not invoked within the idle timeout and {util} < {down:g}%: scale to zero"
    if not inputs.samples:
        return "steady", "no utilization measured yet"
    if estimate.desired > max(inputs.current, 1):
        return "up", f"utilization {newest:.0f}% > {up:g}% (current {inputs.current})"
    if estimate.desired < max(inputs.current, 1):
        return "down", f"utilization {newest:.0f}% < {down:g}% (current {inputs.current})"
    return "steady", f"utilization {newest:.0f}% within {down:g}-{up:g}% (current {inputs.current})"
