"""Instance health: what an instance's observations mean (reference compute-plane §4, NVCA's timeouts).

Pure: the backend observes (processes, exits, readiness), this decides the reported state.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from nvcf_mono.contracts import states
from nvcf_mono.planes.compute.config import HealthSettings


@attrs.frozen(kw_only=True)
class LaunchFailure:
    """The instance cannot start at all (unknown image, missing command): a terminal cause at once."""

    cause: str
    detail: str


@attrs.frozen(kw_only=True)
class Observation:
    """What the backend saw of one instance just now."""

    ready: bool
    #: Why it is not ready ("" when it is), e.g. the worker's readiness detail.
    detail: str = ""
    #: Wall-clock times (epoch seconds) at which one of its processes exited.
    exits: tuple[float, ...] = ()
    #: The last exit, in words ("the inference server exited with code 1").
    last_exit: str = ""
    #: Which process exited last: "inference" or "worker".
    exited_role: str = ""
    failure: LaunchFailure | None = None
    #: A task (run once) ended: how.
    completed: Completion | None = None


@attrs.frozen(kw_only=True)
class Completion:
    """How a task's container ended: its exit code, and a cause when the agent ended it."""

    exit_code: int
    detail: str
    #: ``exceeded-max-runtime`` when the agent stopped it at its deadline; None when it ended itself.
    cause: str | None = None

    @property
    def succeeded(self) -> bool:
        return self.exit_code == 0 and self.cause is None


@attrs.frozen(kw_only=True)
class Verdict:
    """The instance's ``status`` and ``instanceState``, and for a terminal state its cause and why."""

    state: str
    status: str
    cause: str | None = None
    detail: str = ""
    #: ``healthInfo.errorSource``: k8s (the inference server), utils (the worker), init.
    source: str = "k8s"

    @property
    def terminal(self) -> bool:
        return self.state in states.BAD_STATES or self.state == states.SUCCEEDED


def recent(exits: Sequence[float], now: float, window: float) -> list[float]:
    """Exits inside the restart window."""
    return [t for t in exits if now - t <= window]


def evaluate(
    obs: Observation,
    *,
    launched_at: float,
    ready_at: float | None,
    not_ready_since: float | None,
    now: float,
    health: HealthSettings,
) -> Verdict:
    """The verdict on one instance; ``*_at`` are epoch seconds (``ready_at``: first time ready)."""
    if obs.completed is not None:
        done = obs.completed
        if done.succeeded:
            return Verdict(state=states.SUCCEEDED, status=states.TERMINATED_BY_SERVICE, cause=states.TASK_COMPLETED)
        return Verdict(
            state=states.FAILED,
            status=states.TERMINATED_BY_SERVICE,
            cause=done.cause or states.TASK_FAILED,
            detail=done.detail,
        )
    if obs.failure is not None:
        return Verdict(
            state=obs.failure.cause,
            status=states.TERMINATED_BY_SERVICE,
            cause=obs.failure.cause,
            detail=obs.failure.detail,
            source="init" if obs.failure.cause == states.INIT_CONTAINER_STUCK else "k8s",
        )
    exits = recent(obs.exits, now, health.restart_window)
    if len(exits) >= health.restart_limit:
        return Verdict(
            state=states.CONTAINER_RESTART_LOOP,
            status=states.TERMINATED_BY_SERVICE,
            cause=states.CONTAINER_RESTART_LOOP,
            detail=f"restarted {len(exits)} times within {health.restart_window:g}s; last: {obs.last_exit}",
            source="utils" if obs.exited_role == "worker" else "k8s",
        )
    if obs.ready:
        return Verdict(state=states.RUNNING, status=states.FULFILLED)
    if ready_at is None:
        if now - launched_at > health.start_timeout:
            return Verdict(
                state=states.DEGRADED_WORKER,
                status=states.TERMINATED_BY_SERVICE,
                cause=states.DEGRADED_WORKER,
                detail=f"not ready {health.start_timeout:g}s after launch: {obs.detail or 'no reason given'}",
                source="utils",
            )
        return Verdict(state=states.STARTING, status=states.PENDING_FULFILLMENT, detail=obs.detail)
    since = not_ready_since if not_ready_since is not None else now
    if now - since > health.degradation_period:
        return Verdict(
            state=states.DEGRADED_WORKER,
            status=states.TERMINATED_BY_SERVICE,
            cause=states.DEGRADED_WORKER,
            detail=f"not ready for {health.degradation_period:g}s after it had been: {obs.detail or 'no reason given'}",
            source="utils",
        )
    # Was ready, is not now: it does not serve (the control plane stops routing to it) until it recovers.
    return Verdict(state=states.STARTING, status=states.FULFILLED, detail=obs.detail)
