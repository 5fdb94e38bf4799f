"""What a pod's status means for its instance (reference compute-plane §4)."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import pytest

from nvcf_mono.contracts import states
from nvcf_mono.planes.compute.backends.kubernetes.pod_health import RestartLog, Thresholds, missing, observe_pod

NOW = time.time()
LIMITS = Thresholds(scheduling=600, image_pull=60, init=7200, restarts=3)


def at(seconds_ago: float) -> str:
    return datetime.fromtimestamp(NOW - seconds_ago, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod(phase: str = "Pending", age: float = 10, **status: Any) -> dict[str, Any]:
    return {"metadata": {"creationTimestamp": at(age)}, "status": {"phase": phase, "startTime": at(age), **status}}


def waiting(name: str, reason: str, message: str = "") -> dict[str, Any]:
    return {"name": name, "restartCount": 0, "state": {"waiting": {"reason": reason, "message": message}}}


def unschedulable(age: float) -> dict[str, Any]:
    p = pod(age=age)
    del p["status"]["startTime"]
    p["metadata"]["creationTimestamp"] = at(age)
    p["status"]["conditions"] = [
        {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "lastTransitionTime": at(age),
            "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
        }
    ]
    return p


CASES = [
    ("ready", pod("Running", conditions=[{"type": "Ready", "status": "True"}]), None, True),
    ("starting", pod("Running", conditions=[{"type": "Ready", "status": "False"}]), None, False),
    ("unschedulable for a while", unschedulable(60), None, False),
    ("unschedulable too long", unschedulable(700), states.NO_CAPACITY, False),
    ("pulling fails briefly", pod(age=30, containerStatuses=[waiting("inference", "ImagePullBackOff")]), None, False),
    (
        "pulling fails for over a minute",
        pod(age=90, containerStatuses=[waiting("inference", "ErrImagePull", "not found")]),
        states.IMAGE_PULL_ISSUES,
        False,
    ),
    (
        "a bad container config",
        pod(age=90, containerStatuses=[waiting("utils", "CreateContainerConfigError", "secret missing")]),
        states.CREATE_CONTAINER_ERROR,
        False,
    ),
    (
        "a restart loop",
        pod(
            "Running",
            containerStatuses=[
                {
                    "name": "inference",
                    "restartCount": 3,
                    "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}},
                }
            ],
        ),
        states.CONTAINER_RESTART_LOOP,
        False,
    ),
    (
        "an init restart loop",
        pod(initContainerStatuses=[{"name": "init", "restartCount": 4, "state": {}}]),
        states.INIT_CONTAINER_RESTART_LOOP,
        False,
    ),
    (
        "init stuck",
        pod(age=8000, conditions=[{"type": "Initialized", "status": "False"}]),
        states.INIT_CONTAINER_STUCK,
        False,
    ),
    (
        "admission refused",
        pod("Failed", reason="UnexpectedAdmissionError", message="GPU gone"),
        states.ADMISSION_ERROR,
        False,
    ),
    ("a failed pod", pod("Failed", reason="Evicted", message="low memory"), states.FAILED, False),
]


@pytest.mark.parametrize(("name", "p", "cause", "ready"), CASES, ids=[c[0] for c in CASES])
def test_function_pods(name: str, p: dict[str, Any], cause: str | None, ready: bool) -> None:
    obs = observe_pod(p, now=NOW, limits=LIMITS, task=False)
    assert (obs.failure.cause if obs.failure else None) == cause, obs
    assert obs.ready is ready


def test_the_detail_says_why_it_waits() -> None:
    obs = observe_pod(unschedulable(60), now=NOW, limits=LIMITS, task=False)
    assert "Insufficient nvidia.com/gpu" in obs.detail
    obs = observe_pod(unschedulable(700), now=NOW, limits=LIMITS, task=False)
    assert obs.failure is not None and "not scheduled within 600s" in obs.failure.detail


def test_a_missing_pod_is_instance_not_found() -> None:
    assert missing("0-sr-x").failure is not None
    assert missing("0-sr-x").failure.cause == states.NOT_FOUND  # type: ignore[union-attr]


def task_pod(phase: str, code: int | None, **status: Any) -> dict[str, Any]:
    statuses = (
        []
        if code is None
        else [{"name": "task", "state": {"terminated": {"exitCode": code, "reason": "Error" if code else "Completed"}}}]
    )
    return pod(phase, containerStatuses=statuses, **status)


def test_task_pods_complete_with_their_exit_code() -> None:
    ok = observe_pod(task_pod("Succeeded", 0), now=NOW, limits=LIMITS, task=True)
    assert ok.completed is not None and ok.completed.succeeded
    bad = observe_pod(task_pod("Failed", 3), now=NOW, limits=LIMITS, task=True)
    assert bad.completed is not None and bad.completed.exit_code == 3 and "code 3" in bad.completed.detail
    late = observe_pod(
        task_pod("Failed", None, reason="DeadlineExceeded", message="too long"), now=NOW, limits=LIMITS, task=True
    )
    assert late.completed is not None and late.completed.cause == states.EXCEEDED_MAX_RUNTIME
    running = observe_pod(task_pod("Running", None), now=NOW, limits=LIMITS, task=True)
    assert running.completed is None and running.failure is None


def _restarted(count: int, finished_ago: float, now: float | None = None) -> dict[str, Any]:
    finished = datetime.fromtimestamp((now or time.time()) - finished_ago, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return pod(
        "Running",
        conditions=[{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}],
        containerStatuses=[
            {
                "name": "inference",
                "restartCount": count,
                "state": {"running": {}},
                "lastState": {"terminated": {"exitCode": 1, "finishedAt": finished}},
            }
        ],
    )


def test_restarts_count_towards_a_loop_only_within_the_window() -> None:
    limits = Thresholds(scheduling=600, image_pull=60, init=7200, restarts=3, restart_window=600)
    log = RestartLog()
    now = time.time()
    # One restart an hour, seen as they happen: never a loop.
    for hour in range(4):
        later = now + hour * 3600
        obs = observe_pod(_restarted(hour + 1, 5, later), now=later, limits=limits, task=False, restarts=log)
        assert obs.failure is None and obs.ready
    # Then three within two minutes: a loop, and the detail says within what.
    later = now + 4 * 3600
    obs = observe_pod(_restarted(7, 5, later), now=later, limits=limits, task=False, restarts=log)
    assert obs.failure is not None and obs.failure.cause == states.CONTAINER_RESTART_LOOP
    assert "restarted 3 times within 600s" in obs.failure.detail


def test_restarts_found_on_a_first_look_are_dated_by_the_last_exit() -> None:
    limits = Thresholds(scheduling=600, image_pull=60, init=7200, restarts=3, restart_window=600)
    now = time.time()
    old = observe_pod(_restarted(5, 7200), now=now, limits=limits, task=False, restarts=RestartLog())
    assert old.failure is None  # the last exit was two hours ago: not a loop now
    fresh = observe_pod(_restarted(5, 30), now=now, limits=limits, task=False, restarts=RestartLog())
    assert fresh.failure is not None and fresh.failure.cause == states.CONTAINER_RESTART_LOOP
