"""A Helm instance's health from its namespace's objects (reference compute-plane §4, seed 003)."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from nvcf_mono.contracts import states
from nvcf_mono.planes.compute.backends.kubernetes.helm_health import controller_failure, event_verdicts, observe_helm
from nvcf_mono.planes.compute.backends.kubernetes.pod_health import Thresholds

NOW = time.time()
LIMITS = Thresholds(scheduling=600, image_pull=60, init=7200, restarts=3)
READY = {
    "phase": "Running",
    "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}],
}


def pod(name: str, status: dict[str, Any], restart: str = "Always") -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"restartPolicy": restart}, "status": status}


def look(
    others: list[dict[str, Any]], controllers: list[dict[str, Any]] = (), *, flag: bool = False, task: bool = False
) -> Any:  # type: ignore[assignment]
    return observe_helm(
        worker=pod("0-sr-x", READY),
        worker_seen=True,
        worker_name="0-sr-x",
        pods=others,
        controllers=list(controllers),
        by_worker_readiness=flag,
        task=task,
        now=NOW,
        limits=LIMITS,
    )


def test_everything_ready_is_running() -> None:
    view = look([pod("a", READY), pod("job-1", {"phase": "Succeeded"})])
    assert view.observation.ready and view.phase == "Running"


def test_a_pending_object_keeps_it_starting_unless_only_the_worker_counts() -> None:
    pending = pod(
        "b",
        {
            "phase": "Running",
            "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "False"}],
        },
    )
    assert not look([pending]).observation.ready
    assert look([pending]).phase == "Starting"
    flagged = look([pending], flag=True)
    assert flagged.observation.ready and "Pod/b: not ready" in flagged.objects


def test_terminal_objects_fail_the_instance_by_default() -> None:
    crashed = pod(
        "c",
        {"phase": "Running", "containerStatuses": [{"name": "x", "state": {"terminated": {"exitCode": 2}}}]},
        restart="Never",
    )
    view = look([crashed])
    assert view.observation.failure is not None and view.observation.failure.cause == states.FAILED
    assert "container x exited with code 2" in view.observation.failure.detail
    assert look([crashed], flag=True).observation.ready
    stuck = {
        "kind": "Deployment",
        "metadata": {"name": "d"},
        "status": {
            "conditions": [
                {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded", "message": "too slow"}
            ]
        },
    }
    assert controller_failure(stuck) == "Deployment/d: ProgressDeadlineExceeded: too slow"
    assert look([], [stuck]).observation.failure is not None
    assert look([], [stuck], flag=True).observation.ready


def test_a_bad_worker_always_fails_it() -> None:
    view = observe_helm(
        worker=pod("0-sr-x", {"phase": "Failed", "reason": "Evicted"}),
        worker_seen=True, worker_name="0-sr-x", pods=[], controllers=[], by_worker_readiness=True, task=False,
        now=NOW, limits=LIMITS,
    )  # fmt: skip
    assert view.observation.failure is not None
    assert view.observation.failure.detail.startswith("WorkerTerminalBadState")


def test_a_task_ends_with_its_jobs() -> None:
    done = {
        "kind": "Job",
        "metadata": {"name": "j"},
        "status": {"conditions": [{"type": "Complete", "status": "True"}]},
    }
    failed = {
        "kind": "Job",
        "metadata": {"name": "j"},
        "status": {"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]},
    }
    ok = look([], [done], task=True)
    assert ok.observation.completed is not None and ok.observation.completed.succeeded and ok.phase == "Completed"
    bad = look([], [failed], task=True, flag=True)
    assert bad.observation.completed is not None and not bad.observation.completed.succeeded
    assert "BackoffLimitExceeded" in bad.observation.completed.detail


def _event(reason: str, kind: str, name: str, message: str = "", first_ago: float = 0.0) -> dict[str, Any]:
    first = datetime.fromtimestamp(NOW - first_ago, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "type": "Warning",
        "reason": reason,
        "message": message,
        "involvedObject": {"kind": kind, "name": name},
        "firstTimestamp": first,
    }


def test_terminal_warning_events_fail_the_instance_unless_only_the_worker_counts() -> None:
    events = [
        _event("FailedCreate", "ReplicaSet", "inference-5d8", 'pods "inference-5d8-" is forbidden: exceeded quota'),
        _event("BackOff", "Pod", "a", "restarting"),  # a warning that decides nothing
    ]
    verdicts = event_verdicts(events, set(), NOW, 90, {})
    assert verdicts.failures == ('ReplicaSet/inference-5d8: FailedCreate: pods "inference-5d8-" is forbidden: '
                                 "exceeded quota",)  # fmt: skip
    view = observe_helm(
        worker=pod("0-sr-x", READY), worker_seen=True, worker_name="0-sr-x", pods=[], controllers=[],
        by_worker_readiness=False, task=False, now=NOW, limits=LIMITS, verdicts=[verdicts],
    )  # fmt: skip
    assert view.observation.failure is not None and "ObjectsFailed: ReplicaSet/inference-5d8" in (
        view.observation.failure.detail
    )
    flagged = observe_helm(
        worker=pod("0-sr-x", READY), worker_seen=True, worker_name="0-sr-x", pods=[], controllers=[],
        by_worker_readiness=True, task=False, now=NOW, limits=LIMITS, verdicts=[verdicts],
    )  # fmt: skip
    assert flagged.observation.ready


def test_a_transient_failure_fails_only_after_the_backoff_and_is_forgotten_once_the_pod_recovers() -> None:
    since: dict[str, float] = {}
    mount = [_event("FailedMount", "Pod", "a", "MountVolume.SetUp failed", first_ago=30)]
    early = event_verdicts(mount, {"a"}, NOW, 90, since)
    assert early.failures == () and early.waiting[0].startswith("ObjectsFailedWithinBackoffTimeout: Pod/a: FailedMount")
    late = event_verdicts(mount, {"a"}, NOW + 61, 90, since)
    assert late.failures and late.failures[0].startswith("Pod/a: FailedMount for 9")  # timestamps have seconds
    assert event_verdicts(mount, set(), NOW + 62, 90, since) == event_verdicts([], set(), NOW, 90, {})
    assert since == {}  # recovered: forgotten


def test_objects_pending_past_the_limit_fail_the_instance() -> None:
    waiting = pod("b", {"phase": "Running", "conditions": [{"type": "PodScheduled", "status": "True"}]})
    kwargs: dict[str, Any] = {
        "worker": pod("0-sr-x", READY), "worker_seen": True, "worker_name": "0-sr-x", "pods": [waiting],
        "controllers": [], "task": False, "now": NOW, "limits": LIMITS,
    }  # fmt: skip
    before = observe_helm(**kwargs, by_worker_readiness=False, pending=(3600, 10800))
    assert before.observation.failure is None and before.observation.detail.startswith("Starting: ")
    after = observe_helm(**kwargs, by_worker_readiness=False, pending=(10800, 10800))
    assert after.observation.failure is not None
    assert after.observation.failure.detail.startswith("ObjectsTimedOutPending: not all objects ready within 10800s")
    assert observe_helm(**kwargs, by_worker_readiness=True, pending=(10800, 10800)).observation.ready


def test_an_unscheduled_pod_is_the_scheduling_phase() -> None:
    unscheduled = pod("b", {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False"}]})
    view = look([unscheduled])
    assert view.phase == "Installed" and view.observation.detail.startswith("Scheduling: ")
    assert "Pod/b: waiting for a node" in view.objects


def test_a_controller_short_of_ready_replicas_keeps_it_starting() -> None:
    short = {"kind": "Deployment", "metadata": {"name": "inference"}, "spec": {"replicas": 2},
             "status": {"replicas": 2, "readyReplicas": 1}}  # fmt: skip
    view = look([], [short])
    assert view.phase == "Starting" and "Deployment/inference: 1/2 replicas ready" in view.observation.detail
    fresh = {"kind": "Deployment", "metadata": {"name": "inference"}, "spec": {"replicas": 2}}
    assert look([], [fresh]).observation.ready  # no status yet: its pods speak for it
