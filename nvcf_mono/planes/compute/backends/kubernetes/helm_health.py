"""The health of a Helm instance (reference compute-plane §4 "Helm (MiniService) health", seed 003).

By default every rendered object counts: a pod in a bad state, a controller with a terminal condition
or a failed Job fails the instance. With the chart's ``StatusByWorkerReadiness`` flag only the worker's
readiness decides; the other objects' states are reported for debugging. Pure: the pods and controllers
of the instance's namespace in, an observation and the MiniService phase out.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

import attrs

from nvcf_mono.contracts import states
from nvcf_mono.planes.compute.backends.kubernetes import miniservice as ms
from nvcf_mono.planes.compute.backends.kubernetes.extensions import Verdicts
from nvcf_mono.planes.compute.backends.kubernetes.pod_health import (
    RestartLog,
    Thresholds,
    conditions_of,
    missing,
    observe_pod,
    parse_time,
)
from nvcf_mono.planes.compute.health import Completion, LaunchFailure, Observation

Obj = Mapping[str, Any]
#: Kinds whose conditions the built-in rules read.
CONDITION_KINDS = frozenset({"Deployment", "ReplicaSet", "StatefulSet", "Job", "CronJob"})
#: Warning events that fail an instance at once, and those that fail it only when they last (seed 003).
TERMINAL_EVENTS = frozenset({"FailedCreate", "FailedUpdate", "ReplicaSetCreateError"})
TRANSIENT_EVENTS = frozenset({"FailedMount", "FailedAttachVolume"})


@attrs.frozen(kw_only=True)
class HelmView:
    observation: Observation
    phase: str
    #: What the objects other than the worker are doing (for the instance's detail and the MiniService).
    objects: tuple[str, ...] = ()


def _name(obj: Obj) -> str:
    return f"{obj.get('kind', 'Pod')}/{obj.get('metadata', {}).get('name', '?')}"


def controller_failure(obj: Obj) -> str | None:
    """A controller's terminal condition, in words (ProgressDeadlineExceeded, a replica failure, a failed Job)."""
    conditions = conditions_of(obj)
    progressing = conditions.get("Progressing", {})
    if progressing.get("reason") == "ProgressDeadlineExceeded":
        return f"{_name(obj)}: ProgressDeadlineExceeded: {progressing.get('message', '')}".rstrip(": ")
    replica = conditions.get("ReplicaFailure", {})
    if replica.get("status") == "True":
        return f"{_name(obj)}: {replica.get('reason', 'ReplicaFailure')}: {replica.get('message', '')}".rstrip(": ")
    failed = conditions.get("Failed", {})
    if obj.get("kind") == "Job" and failed.get("status") == "True":
        return f"{_name(obj)}: {failed.get('reason', 'Failed')}: {failed.get('message', '')}".rstrip(": ")
    return None


def controller_waiting(obj: Obj) -> str | None:
    """A Deployment, StatefulSet or ReplicaSet whose status shows fewer ready replicas than it wants."""
    if obj.get("kind") not in ("Deployment", "StatefulSet", "ReplicaSet") or not obj.get("status"):
        return None  # no status yet: its pods speak for it
    wanted = int((obj.get("spec") or {}).get("replicas", 1))
    ready = int(obj["status"].get("readyReplicas", 0))
    return f"{_name(obj)}: {ready}/{wanted} replicas ready" if ready < wanted else None


def _never_restarted_failure(pod: Obj) -> str | None:
    """A ``restartPolicy: Never`` container that exited non-zero (degraded at once)."""
    if (pod.get("spec") or {}).get("restartPolicy") != "Never":
        return None
    for cs in pod.get("status", {}).get("containerStatuses") or ():
        ended = (cs.get("state") or {}).get("terminated") or {}
        if ended and int(ended.get("exitCode", 0)) != 0:
            return f"{_name(pod)}: container {cs.get('name')} exited with code {ended.get('exitCode')}"
    return None


def _pod_state(pod: Obj, now: float, limits: Thresholds, restarts: RestartLog | None) -> tuple[str | None, bool, bool]:
    """(failure in words or None, ready or done, scheduled) of one chart pod."""
    phase = pod.get("status", {}).get("phase")
    scheduled = conditions_of(pod).get("PodScheduled", {}).get("status") == "True" or phase not in (None, "Pending")
    if phase == "Succeeded":
        return None, True, True
    never = _never_restarted_failure(pod)
    if never is not None:
        return never, False, scheduled
    obs = observe_pod(pod, now=now, limits=limits, task=False, restarts=restarts)
    if obs.failure is not None:
        return f"{_name(pod)}: {obs.failure.cause}: {obs.failure.detail}", False, scheduled
    return None, obs.ready, scheduled


def _objects_state(
    pods: Sequence[Obj],
    controllers: Sequence[Obj],
    *,
    verdicts: Sequence[Verdicts],
    restarts: Mapping[str, RestartLog] | None,
    now: float,
    limits: Thresholds,
) -> tuple[list[str], list[str], bool]:
    """(failures, what is waiting, every pod scheduled) of the chart's objects, in words."""
    failures: list[str] = [f for v in verdicts for f in v.failures]
    waiting: list[str] = [w for v in verdicts for w in v.waiting]
    all_scheduled = True
    for pod in pods:
        log = restarts.get(pod.get("metadata", {}).get("name", "")) if restarts is not None else None
        failure, ready, scheduled = _pod_state(pod, now, limits, log)
        all_scheduled &= scheduled
        if failure is not None:
            failures.append(failure)
        elif not scheduled:
            waiting.append(f"{_name(pod)}: waiting for a node")
        elif not ready:
            waiting.append(f"{_name(pod)}: not ready")
    for obj in controllers:
        failure = controller_failure(obj)
        if failure is not None:
            failures.append(failure)
        elif (short := controller_waiting(obj)) is not None:
            waiting.append(short)
    return failures, waiting, all_scheduled


def observe_helm(
    *,
    worker: Obj | None,
    worker_seen: bool,
    worker_name: str,
    pods: Sequence[Obj],
    controllers: Sequence[Obj],
    by_worker_readiness: bool,
    task: bool,
    now: float,
    limits: Thresholds,
    verdicts: Sequence[Verdicts] = (),
    restarts: Mapping[str, RestartLog] | None = None,
    pending: tuple[float, float] | None = None,
) -> HelmView:
    """The instance's observation and phase from its namespace's objects, and further verdicts (events,
    extensions). ``restarts``: each pod's restart log, by name; ``pending``: (seconds the objects have
    not all been ready, the limit).
    """
    failures, waiting, all_scheduled = _objects_state(
        pods, controllers, verdicts=verdicts, restarts=restarts, now=now, limits=limits
    )
    notes = tuple(failures + waiting)

    if task:
        # A task is its Jobs: they decide its end whatever the flag says.
        outcome = _task_outcome(pods, controllers)
        if outcome is not None:
            return HelmView(observation=Observation(ready=False, completed=outcome), phase=ms.COMPLETED, objects=notes)

    if worker is None:
        if worker_seen:
            return HelmView(observation=missing(worker_name), phase=ms.FAILED, objects=notes)
        return HelmView(
            observation=Observation(ready=False, detail="the worker's pod is being created"), phase=ms.INSTALLED
        )
    worker_log = restarts.get(worker_name) if restarts is not None else None
    worker_obs = observe_pod(worker, now=now, limits=limits, task=False, restarts=worker_log)
    if worker_obs.failure is not None:
        return HelmView(
            observation=Observation(
                ready=False,
                failure=LaunchFailure(
                    cause=worker_obs.failure.cause, detail=f"WorkerTerminalBadState: {worker_obs.failure.detail}"
                ),
            ),
            phase=ms.FAILED,
            objects=notes,
        )
    if failures and not by_worker_readiness:
        detail = "ObjectsFailed: " + "; ".join(failures)
        return HelmView(
            observation=Observation(ready=False, failure=LaunchFailure(cause=states.FAILED, detail=detail)),
            phase=ms.FAILED,
            objects=notes,
        )
    others_ready = by_worker_readiness or not waiting
    if worker_obs.ready and others_ready:
        return HelmView(observation=Observation(ready=True), phase=ms.RUNNING, objects=notes)
    if pending is not None and not by_worker_readiness and pending[0] >= pending[1]:
        detail = f"ObjectsTimedOutPending: not all objects ready within {pending[1]:g}s: " + "; ".join(
            waiting or [f"worker: {worker_obs.detail}"]
        )
        timed_out = LaunchFailure(cause=states.FAILED, detail=detail)
        return HelmView(observation=Observation(ready=False, failure=timed_out), phase=ms.FAILED, objects=notes)
    detail = worker_obs.detail if not worker_obs.ready else "WaitingOnObjectReadiness: " + "; ".join(waiting)
    # NVCA's instance phases: Scheduling until every pod has a node, then Starting.
    detail = ("Starting: " if all_scheduled else "Scheduling: ") + detail
    phase = ms.STARTING if all_scheduled else ms.INSTALLED
    return HelmView(observation=Observation(ready=False, detail=detail), phase=phase, objects=notes)


def event_verdicts(
    events: Sequence[Obj], unready: Collection[str], now: float, backoff: float, since: dict[str, float]
) -> Verdicts:
    """What the namespace's warning events say (seed 003): a terminal one (``FailedCreate``, a forbidden
    error, ...) fails the instance; a transient one (``FailedMount``, ``FailedAttachVolume``) on a pod that
    is still not ready fails it only after ``backoff`` seconds. ``since`` keeps when each pod's transient
    failure was first seen (updated here; a pod that recovered is forgotten).
    """
    failures: list[str] = []
    waiting: list[str] = []
    failing: set[str] = set()
    for event in events:
        if event.get("type") != "Warning":
            continue
        involved = event.get("involvedObject") or {}
        what = f"{involved.get('kind', '?')}/{involved.get('name', '?')}"
        reason, message = str(event.get("reason", "")), str(event.get("message", ""))
        if reason in TERMINAL_EVENTS or "forbidden:" in message:
            failures.append(f"{what}: {reason}: {message}".rstrip(": "))
        elif reason in TRANSIENT_EVENTS and involved.get("kind") == "Pod" and involved.get("name") in unready:
            if what in failing:
                continue
            failing.add(what)
            first = since.setdefault(what, parse_time(event.get("firstTimestamp")) or now)
            if now - first >= backoff:
                failures.append(f"{what}: {reason} for {now - first:.0f}s: {message}".rstrip(": "))
            else:
                waiting.append(f"ObjectsFailedWithinBackoffTimeout: {what}: {reason}: {message}".rstrip(": "))
    for gone in set(since) - failing:
        del since[gone]
    return Verdicts(failures=tuple(failures), waiting=tuple(waiting))


def _task_outcome(pods: Sequence[Obj], controllers: Sequence[Obj]) -> Completion | None:
    """A Helm task ends when its Jobs do (or, without Jobs, when all its pods succeeded)."""
    jobs = [c for c in controllers if c.get("kind") == "Job"]
    for job in jobs:
        failure = controller_failure(job)
        if failure is not None:
            return Completion(exit_code=1, detail=failure)
    if jobs:
        done = all(conditions_of(j).get("Complete", {}).get("status") == "True" for j in jobs)
        return Completion(exit_code=0, detail="") if done else None
    if pods and all(p.get("status", {}).get("phase") == "Succeeded" for p in pods):
        return Completion(exit_code=0, detail="")
    return None
