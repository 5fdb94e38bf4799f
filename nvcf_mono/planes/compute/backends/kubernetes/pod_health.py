"""What a pod's status says about its instance (reference compute-plane §4, ``podPhaseToInstanceState``).

Pure: a pod (as the API returns it, a dict) and the time in, an :class:`Observation` out. A bad
state is a :class:`LaunchFailure` with its cause; readiness is the pod's ``Ready`` condition, whose
startup and degradation timeouts the agent applies (``health.evaluate``) as for every backend.
Clocks start at the pod's ``startTime``, else its creation.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

import attrs

from nvcf_mono.contracts import states
from nvcf_mono.planes.compute.backends.kubernetes.manifests import TASK, UTILS
from nvcf_mono.planes.compute.health import Completion, LaunchFailure, Observation

_PULL_ERRORS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"})
_CREATE_ERRORS = frozenset({"CreateContainerConfigError", "CreateContainerError", "RunContainerError"})


@attrs.frozen(kw_only=True)
class Thresholds:
    """How long each bad condition may last before it is terminal (seconds)."""

    scheduling: float
    image_pull: float
    init: float
    restarts: int
    #: Restarts count towards ``restarts`` only within this many seconds (a crash loop, not a restart a day).
    restart_window: float = 600.0


@attrs.define
class RestartLog:
    """When one pod's containers restarted, as the agent saw their ``restartCount`` grow.

    A pod's status holds a count and the last exit only; the window needs times. A restart is dated
    by the container's last exit (``lastState.terminated.finishedAt``) when that is newer than what was
    seen before, else by the look that noticed it. Restarts found on the first look (an agent that
    restarted) are all dated by the last exit: a long-running container that restarted a few times
    over days is not a loop, one whose last exit was a minute ago with three restarts is.
    """

    counts: dict[str, int] = attrs.field(factory=dict)
    times: dict[str, list[float]] = attrs.field(factory=dict)

    def recent(self, pod: Mapping[str, Any], now: float, window: float) -> dict[str, int]:
        """Container name -> restarts within ``window`` before ``now``."""
        out = {}
        for cs in [*_statuses(pod, "initContainerStatuses"), *_statuses(pod, "containerStatuses")]:
            name, count = str(cs.get("name", "?")), int(cs.get("restartCount", 0))
            grew = count - self.counts.get(name, 0)
            if grew > 0:
                last = parse_time(((cs.get("lastState") or {}).get("terminated") or {}).get("finishedAt"))
                when = last if last is not None and name in self.counts else (last or now)
                self.times.setdefault(name, []).extend([when] * grew)
            self.counts[name] = count
            kept = [t for t in self.times.get(name, ()) if now - t < window]
            self.times[name] = kept
            out[name] = len(kept)
        return out


def parse_time(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def conditions_of(obj: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """An object's status conditions by type (pods and controllers alike)."""
    return {c.get("type", ""): c for c in obj.get("status", {}).get("conditions") or ()}


def is_ready(pod: Mapping[str, Any]) -> bool:
    return conditions_of(pod).get("Ready", {}).get("status") == "True"


def started_at(pod: Mapping[str, Any]) -> float | None:
    """When the pod's clocks start: ``startTime``, else when it was found unschedulable, else its creation."""
    status = pod.get("status", {})
    scheduled = conditions_of(pod).get("PodScheduled", {})
    return (
        parse_time(status.get("startTime"))
        or (parse_time(scheduled.get("lastTransitionTime")) if scheduled.get("status") == "False" else None)
        or parse_time(pod.get("metadata", {}).get("creationTimestamp"))
    )


def _statuses(pod: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    return list(pod.get("status", {}).get(key) or ())


def _waiting(statuses: Iterable[Mapping[str, Any]]) -> list[tuple[str, str, str]]:
    """``(container, reason, message)`` of each container waiting for a reason."""
    out = []
    for cs in statuses:
        waiting = (cs.get("state") or {}).get("waiting")
        if waiting and waiting.get("reason"):
            out.append((cs.get("name", "?"), waiting["reason"], waiting.get("message", "")))
    return out


def _terminated(cs: Mapping[str, Any]) -> Mapping[str, Any] | None:
    state = cs.get("state") or {}
    return state.get("terminated") if isinstance(state.get("terminated"), dict) else None


def _last_exit(cs: Mapping[str, Any]) -> str:
    last = (cs.get("lastState") or {}).get("terminated") or {}
    if not last:
        return ""
    code = last.get("exitCode")
    reason = last.get("reason") or ""
    return f"{cs.get('name', '?')} exited with code {code}" + (f" ({reason})" if reason else "")


def _failure(cause: str, detail: str) -> Observation:
    return Observation(ready=False, failure=LaunchFailure(cause=cause, detail=detail), detail=detail)


def _task_outcome(pod: Mapping[str, Any]) -> Observation | None:
    """A task pod that ended: its ``task`` container's exit code (or the deadline that stopped it)."""
    status = pod.get("status", {})
    phase = status.get("phase")
    if phase not in ("Succeeded", "Failed"):
        return None
    if status.get("reason") == "DeadlineExceeded":
        return Observation(
            ready=False,
            completed=Completion(
                exit_code=-1,
                detail=status.get("message", "the task ran past its maxRuntimeDuration"),
                cause=states.EXCEEDED_MAX_RUNTIME,
            ),
        )
    for cs in _statuses(pod, "containerStatuses"):
        if cs.get("name") == TASK:
            ended = _terminated(cs)
            if ended is not None:
                code = int(ended.get("exitCode", 1))
                reason = ended.get("reason") or ""
                detail = (
                    ""
                    if code == 0
                    else f"the task's container exited with code {code}" + (f" ({reason})" if reason else "")
                )
                return Observation(ready=False, completed=Completion(exit_code=code, detail=detail))
    detail = status.get("message") or f"the task's pod {phase.lower()} without the task's exit code"
    return Observation(ready=False, completed=Completion(exit_code=0 if phase == "Succeeded" else 1, detail=detail))


def observe_pod(
    pod: Mapping[str, Any], *, now: float, limits: Thresholds, task: bool, restarts: RestartLog | None = None
) -> Observation:
    """The observation of one instance's pod at ``now`` (epoch seconds); ``restarts`` dates the pod's
    restarts for the window (without it, every restart counts).
    """
    status = pod.get("status", {})
    phase = status.get("phase", "Pending")
    conditions = conditions_of(pod)
    since = started_at(pod) or now
    age = now - since
    if phase == "Failed" and status.get("reason") == "UnexpectedAdmissionError":
        return _failure(states.ADMISSION_ERROR, status.get("message") or "the node refused the pod")
    if task:
        outcome = _task_outcome(pod)
        if outcome is not None:
            return outcome
    elif phase == "Failed":
        return _failure(states.FAILED, status.get("message") or status.get("reason") or "the pod failed")
    scheduled = conditions.get("PodScheduled", {})
    if phase == "Pending" and scheduled.get("status") == "False":
        why = scheduled.get("message") or scheduled.get("reason") or "not scheduled"
        if age > limits.scheduling:
            return _failure(states.NO_CAPACITY, f"not scheduled within {limits.scheduling:g}s: {why}")
        return Observation(ready=False, detail=f"waiting for a node: {why}")
    init_statuses = _statuses(pod, "initContainerStatuses")
    main_statuses = _statuses(pod, "containerStatuses")
    for name, reason, message in _waiting([*init_statuses, *main_statuses]):
        if reason in _PULL_ERRORS and age > limits.image_pull:
            return _failure(states.IMAGE_PULL_ISSUES, f"{name}: {reason}: {message}".rstrip(": "))
        if reason in _CREATE_ERRORS and age > limits.image_pull:
            return _failure(states.CREATE_CONTAINER_ERROR, f"{name}: {reason}: {message}".rstrip(": "))
    recent = restarts.recent(pod, now, limits.restart_window) if restarts is not None else None
    for is_init, cs in [*((True, c) for c in init_statuses), *((False, c) for c in main_statuses)]:
        count = recent.get(cs.get("name", "?"), 0) if recent is not None else int(cs.get("restartCount", 0))
        if count < limits.restarts:
            continue
        # A native sidecar (the task's worker) restarts like a container; other init containers loop.
        init = is_init and not (cs.get("name") == UTILS and task)
        cause = states.INIT_CONTAINER_RESTART_LOOP if init else states.CONTAINER_RESTART_LOOP
        within = f" within {limits.restart_window:g}s" if recent is not None else ""
        return _failure(cause, f"restarted {count} times{within}; last: {_last_exit(cs)}")
    initialized = conditions.get("Initialized", {})
    if initialized.get("status") == "False" and age > limits.init:
        return _failure(states.INIT_CONTAINER_STUCK, f"not initialized within {limits.init:g}s")
    ready = conditions.get("Ready", {})
    if ready.get("status") == "True":
        return Observation(ready=True)
    waiting = _waiting([*init_statuses, *main_statuses])
    if waiting:
        name, reason, message = waiting[0]
        detail = f"{name}: {reason}" + (f": {message}" if message else "")
    elif phase == "Running":
        detail = ready.get("message") or "the worker is not ready yet"
    else:
        detail = f"pod {phase.lower()}"
    return Observation(ready=False, detail=detail)


def aggregate_state(pod: Mapping[str, Any] | None, obs: Observation) -> str:
    """The instance's aggregate state on its ICMSRequest: Scheduling (no node yet), Pending (scheduled, not
    ready), Succeeded (ready, or a task that succeeded) or Failed.
    """
    if obs.failure is not None or (obs.completed is not None and not obs.completed.succeeded):
        return "Failed"
    if obs.ready or obs.completed is not None:
        return "Succeeded"
    if pod is None or conditions_of(pod).get("PodScheduled", {}).get("status") != "True":
        return "Scheduling"
    return "Pending"


def missing(name: str) -> Observation:
    """The pod is gone without the agent deleting it (evicted, deleted by hand)."""
    return _failure(states.NOT_FOUND, f"pod {name} no longer exists")
