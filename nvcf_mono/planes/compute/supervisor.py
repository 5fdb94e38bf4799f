"""Supervision of one agent's instances: start (or take over) through the backend, look at each one
every probe interval, turn what is seen into a state (``health.py``), record it, and stop it when
asked or when it failed. One task per instance, in the agent's task group.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import anyio
import attrs
from anyio.abc import TaskGroup

from nvcf_mono.bus.errors import BusError
from nvcf_mono.contracts import states
from nvcf_mono.contracts.agent import AgentInstance, AgentRequest
from nvcf_mono.models.common import iso, now_iso, parse_iso
from nvcf_mono.planes.compute.backends import Backend, InstanceHandle, LaunchSpec
from nvcf_mono.planes.compute.config import ComputeConfig
from nvcf_mono.planes.compute.gpus import Allocation, Allocator, instance_limits
from nvcf_mono.planes.compute.health import LaunchFailure, Observation, Verdict, evaluate
from nvcf_mono.planes.compute.requests import RequestBook, replace_instance
from nvcf_mono.structure import evolve

#: Why an instance stops when the control plane asked for it (a termination message).
BY_USER = "by-user"


@attrs.define(eq=False)
class Live:
    """An instance being supervised right now."""

    request_id: str
    instance_id: str
    allocation: Allocation | None
    #: Earlier exits (epoch seconds) of an instance taken over after a restart.
    prior_exits: tuple[float, ...] = ()
    prior_restarts: int = 0
    stop_reason: str | None = None
    #: How long its processes get between SIGTERM and SIGKILL (None: the configured grace).
    stop_grace: float | None = None
    stopping: anyio.Event = attrs.field(factory=anyio.Event)
    done: anyio.Event = attrs.field(factory=anyio.Event)
    handle: InstanceHandle | None = None

    def stop(self, reason: str, grace: float | None = None) -> None:
        if self.stop_reason is None:
            self.stop_reason = reason
        if grace is not None:
            self.stop_grace = grace if self.stop_grace is None else min(grace, self.stop_grace)
        self.stopping.set()


def epoch(text: str | None) -> float | None:
    return parse_iso(text).timestamp() if text else None


def iso_at(seconds: float) -> str:
    """An epoch time in the platform's timestamp format."""
    return iso(datetime.fromtimestamp(seconds, UTC))


def stopped(inst: AgentInstance, reason: str) -> AgentInstance:
    """The instance after the agent stopped it for ``reason`` (by-user, or a termination cause)."""
    now = now_iso()
    if reason == BY_USER:
        return evolve(inst, state=states.TERMINATED, status=states.TERMINATED_BY_USER, stop=reason, updated_at=now)
    return evolve(
        inst,
        state=states.TERMINATED,
        status=states.TERMINATED_BY_SERVICE,
        termination_cause=reason,
        stop=reason,
        updated_at=now,
    )


def failed(inst: AgentInstance, failure: LaunchFailure) -> AgentInstance:
    """The instance after it failed without ever running."""
    return evolve(
        inst,
        state=failure.cause,
        status=states.TERMINATED_BY_SERVICE,
        termination_cause=failure.cause,
        error_log=failure.detail,
        error_source="k8s",
        updated_at=now_iso(),
    )


def allocation_of(req: AgentRequest, inst: AgentInstance) -> Allocation:
    """The GPUs an instance record holds."""
    return Allocation(gpu=req.message.gpu_type.upper(), node=inst.node, devices=inst.devices)


class Supervisor:
    """Runs the instances of one agent and records what happens to them."""

    def __init__(
        self,
        *,
        cluster_id: str,
        book: RequestBook,
        backend: Backend,
        allocator: Allocator,
        config: ComputeConfig,
        state_dir: Path,
        log: logging.Logger,
        changed: Callable[[], None],
        freed: Callable[[], None],
    ) -> None:
        self._cluster_id = cluster_id
        self._book = book
        self._backend = backend
        self._allocator = allocator
        self._config = config
        self._state_dir = state_dir
        self._log = log
        #: Called when an instance's reported state changed (wakes the reporter).
        self._changed = changed
        #: Called when GPUs were given back (wakes the heartbeat).
        self._freed = freed
        self._lives: dict[str, Live] = {}
        self._tg: TaskGroup | None = None

    def bind(self, tg: TaskGroup) -> None:
        """Where supervision tasks run (the agent's task group)."""
        self._tg = tg

    def live(self, instance_id: str) -> Live | None:
        return self._lives.get(instance_id)

    def lives(self) -> list[Live]:
        return list(self._lives.values())

    # ---- what the agent asks ----------------------------------------------------------------------

    def supervise(self, req: AgentRequest, inst: AgentInstance, *, adopt: bool) -> None:
        """Start (or, with ``adopt``, take over) an instance and watch it."""
        if inst.instance_id in self._lives:
            return
        assert self._tg is not None, "bind() the supervisor first"
        live = Live(
            request_id=req.request_id,
            instance_id=inst.instance_id,
            allocation=allocation_of(req, inst) if inst.devices else None,
            prior_exits=tuple(t for t in (epoch(s) for s in inst.restart_times) if t is not None) if adopt else (),
            prior_restarts=inst.restarts if adopt else 0,
        )
        if inst.stop is not None:
            live.stop(inst.stop)
        self._lives[inst.instance_id] = live
        self._tg.start_soon(self._supervise, live, inst if adopt else None)

    async def stop(self, request_id: str, instance_id: str, reason: str) -> None:
        """Stop an instance for ``reason``; the intent is stored before anything is signalled."""
        req = self._book.get(request_id)
        inst = req.instance(instance_id) if req is not None else None
        if req is None or inst is None or inst.gone:
            return
        live = self._lives.get(instance_id)
        if live is None:
            # Nothing runs yet (not launched): it is gone as soon as it is recorded so.
            await self.update(request_id, instance_id, lambda i: stopped(i, reason))
            self.release(req, inst)
            self._changed()
            return
        await self.update(request_id, instance_id, lambda i: evolve(i, stop=i.stop or reason))
        live.stop(reason)

    async def stop_all(self, reason: str, grace: float) -> None:
        """Stop every instance (the host stops), waiting up to ``grace`` (+ the final kill)."""
        lives = list(self._lives.values())
        for live in lives:
            live.stop(reason, grace)
        with anyio.move_on_after(grace + 5):
            for live in lives:
                await live.done.wait()

    async def fail(self, request_id: str, instance_id: str, failure: LaunchFailure) -> None:
        """Record an instance as failed without starting it (a workload the backend cannot run)."""
        req = await self.update(request_id, instance_id, lambda i: failed(i, failure))
        inst = req.instance(instance_id) if req is not None else None
        if req is not None and inst is not None:
            self.release(req, inst)
        self._changed()

    def release(self, req: AgentRequest, inst: AgentInstance) -> None:
        """Give an instance's GPUs back."""
        if inst.devices:
            self._allocator.release(allocation_of(req, inst))
            self._freed()

    async def update(
        self, request_id: str, instance_id: str, change: Callable[[AgentInstance], AgentInstance]
    ) -> AgentRequest | None:
        """Change one instance's record (CAS); None if the request is gone or the bus failed."""

        def apply(req: AgentRequest) -> AgentRequest:
            inst = req.instance(instance_id)
            return req if inst is None else replace_instance(req, change(inst))

        try:
            return await self._book.update(request_id, apply)
        except BusError as err:
            self._log.warning("storing instance %s failed: %s", instance_id, err)
            return None

    # ---- one instance ------------------------------------------------------------------------------

    async def _supervise(self, live: Live, adopt: AgentInstance | None) -> None:
        req = self._book.get(live.request_id)
        finished = False
        try:
            if req is None:
                finished = True
                return
            if adopt is None and live.stop_reason is not None:
                reason = live.stop_reason  # stopped before it ever started
                await self.update(live.request_id, live.instance_id, lambda i: stopped(i, reason))
                self._changed()
                finished = True
                return
            cpus, memory = (
                instance_limits(self._allocator.inventory, live.allocation) if live.allocation else (None, None)
            )
            spec = LaunchSpec(
                cluster_id=self._cluster_id,
                request_id=live.request_id,
                instance_id=live.instance_id,
                message=req.message,
                allocation=live.allocation,
                directory=self._state_dir / "instances" / live.instance_id,
                cpus=cpus,
                memory=memory,
            )
            handle = await (self._backend.adopt(spec, adopt) if adopt is not None else self._backend.start(spec))
            live.handle = handle
            stamp = now_iso()
            await self.update(
                live.request_id,
                live.instance_id,
                lambda i: evolve(
                    i,
                    port=handle.port,
                    health_port=handle.health_port,
                    directory=str(spec.directory),
                    processes=handle.processes,
                    launched_at=i.launched_at or stamp,
                    updated_at=stamp,
                ),
            )
            finished = await self._watch(live, handle)
        finally:
            # Cancelled without a stop (the host leaves instances running): nothing is touched.
            if finished or live.stop_reason is not None:
                with anyio.CancelScope(shield=True):
                    if live.handle is not None and not finished:
                        await self._backend.stop(live.handle, 0)
                    if live.handle is not None:
                        await self._backend.release(live.handle)
                    if live.allocation is not None:
                        self._allocator.release(live.allocation)
                        self._freed()
            self._lives.pop(live.instance_id, None)
            live.done.set()

    async def _watch(self, live: Live, handle: InstanceHandle) -> bool:
        """Observe until the instance fails or is stopped; True once it is gone and recorded so."""
        health = self._config.health
        while live.stop_reason is None:
            try:
                if await self._tick(live, handle):
                    return True
            except Exception:
                # A bug must not leave the instance unwatched: log it and look again next time.
                self._log.exception("watching instance %s failed", live.instance_id)
            with anyio.move_on_after(health.probe_interval):
                await live.stopping.wait()
        reason = live.stop_reason
        self._log.info("stopping instance %s (%s)", live.instance_id, reason)
        grace = self._config.local.termination_grace if live.stop_grace is None else live.stop_grace
        await self._backend.stop(handle, grace)
        await self.update(live.request_id, live.instance_id, lambda i: stopped(i, reason))
        self._changed()
        return True

    async def _tick(self, live: Live, handle: InstanceHandle) -> bool:
        """One look at the instance; True once it failed (stopped, and recorded so)."""
        obs = await self._backend.observe(handle)
        if live.prior_exits:
            obs = attrs.evolve(obs, exits=live.prior_exits + obs.exits)
        req = self._book.get(live.request_id)
        inst = req.instance(live.instance_id) if req is not None else None
        if req is None or inst is None:
            await self._backend.stop(handle, 0)
            return True
        verdict = evaluate(
            obs,
            launched_at=epoch(inst.launched_at) or time.time(),
            ready_at=epoch(inst.ready_at),
            not_ready_since=epoch(inst.not_ready_since),
            now=time.time(),
            health=self._config.health,
        )
        if verdict.terminal:
            # NVCA force-deletes a pod in a bad state: a short grace, then SIGKILL.
            await self._backend.stop(handle, min(1.0, self._config.local.termination_grace))
            self._log.info("instance %s: %s: %s", live.instance_id, verdict.state, verdict.detail)
            error = None if verdict.state == states.SUCCEEDED else self._error_log(handle, verdict)
            await self._record(live, handle, obs, verdict, error)
            return True
        await self._record(live, handle, obs, verdict, None)
        return False

    def _error_log(self, handle: InstanceHandle, verdict: Verdict) -> str:
        """Why it failed, then the end of the log that shows it (``healthInfo.errorLog``)."""
        limit = self._config.local.error_log_bytes
        detail = verdict.detail[: limit // 2]  # the reason always fits; the log gets the rest
        tail = self._backend.error_log(handle, verdict.source, limit - len(detail.encode()) - 1)
        return f"{detail}\n{tail}" if tail else detail

    async def _record(
        self, live: Live, handle: InstanceHandle, obs: Observation, verdict: Verdict, error: str | None
    ) -> None:
        now = time.time()
        stamp = iso_at(now)
        window = self._config.health.restart_window

        def change(inst: AgentInstance) -> AgentInstance:
            ready = verdict.state == states.RUNNING
            updated = evolve(
                inst,
                state=verdict.state,
                status=verdict.status,
                processes=handle.processes,
                restarts=live.prior_restarts + len(obs.exits) - len(live.prior_exits),
                restart_times=tuple(iso_at(t) for t in obs.exits if now - t <= window)[-10:],
                ready_at=inst.ready_at or (stamp if ready else None),
                not_ready_since=None if ready else (inst.not_ready_since or (stamp if inst.ready_at else None)),
            )
            if verdict.terminal:
                updated = evolve(
                    updated, termination_cause=verdict.cause, error_log=error, error_source=verdict.source, processes=()
                )
            return updated if updated == inst else evolve(updated, updated_at=stamp)

        before = self._book.get(live.request_id)
        old = before.instance(live.instance_id) if before is not None else None
        await self.update(live.request_id, live.instance_id, change)
        if old is not None and (old.state, old.status) != (verdict.state, verdict.status):
            self._changed()
