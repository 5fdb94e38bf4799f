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


def observe_pod(pod: Mapping[str, Any], *, now: float, limits: Thresholds, task: bool) -> Observation:
    """The observation of one instance's pod at ``now`` (epoch seconds)."""
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
    for cs in init_statuses:
        # A native sidecar (the task's worker) restarts like a container; other init containers loop.
        sidecar = cs.get("name") == UTILS and task
        if int(cs.get("restartCount", 0)) >= limits.restarts:
            cause = states.CONTAINER_RESTART_LOOP if sidecar else states.INIT_CONTAINER_RESTART_LOOP
            return _failure(cause, f"restarted {cs.get('restartCount')} times; last: {_last_exit(cs)}")
    for cs in main_statuses:
        if int(cs.get("restartCount", 0)) >= limits.restarts:
            return _failure(
                states.CONTAINER_RESTART_LOOP, f"restarted {cs.get('restartCount')} times; last: {_last_exit(cs)}"
            )
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


def missing(name: str) -> Observation:
    """The pod is gone without the agent deleting it (evicted, deleted by hand)."""
    return _failure(states.NOT_FOUND, f"pod {name} no longer exists")
