"""A Helm instance's health from its namespace's objects (reference compute-plane §4, seed 003)."""

from __future__ import annotations

import time
from typing import Any

from nvcf_mono.contracts import states
from nvcf_mono.planes.compute.backends.kubernetes.helm_health import controller_failure, observe_helm
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
