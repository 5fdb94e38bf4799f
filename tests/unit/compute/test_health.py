"""What an instance's observations mean (reference compute-plane §4 timeouts, short here)."""

from __future__ import annotations

import attrs

from nvcf_mono.contracts import states
from nvcf_mono.planes.compute.config import HealthSettings
from nvcf_mono.planes.compute.health import LaunchFailure, Observation, evaluate

HEALTH = HealthSettings(start_timeout=60, degradation_period=30, restart_limit=3, restart_window=100)
T0 = 1_000_000.0


def verdict(obs: Observation, now: float, ready_at: float | None = None, not_ready_since: float | None = None):  # type: ignore[no-untyped-def]
    return evaluate(obs, launched_at=T0, ready_at=ready_at, not_ready_since=not_ready_since, now=now, health=HEALTH)


def test_starting_then_running() -> None:
    starting = verdict(Observation(ready=False, detail="waiting"), T0 + 5)
    assert (starting.state, starting.status, starting.terminal) == (states.STARTING, states.PENDING_FULFILLMENT, False)
    running = verdict(Observation(ready=True), T0 + 6)
    assert (running.state, running.status) == (states.RUNNING, states.FULFILLED)


def test_a_launch_failure_is_terminal_at_once() -> None:
    failure = LaunchFailure(cause=states.IMAGE_PULL_ISSUES, detail="image 'x' is not in the catalog")
    got = verdict(Observation(ready=False, failure=failure), T0 + 0.1)
    assert got.terminal and got.cause == states.IMAGE_PULL_ISSUES and got.status == states.TERMINATED_BY_SERVICE
    assert got.detail == failure.detail


def test_restarts_within_the_window_are_a_loop() -> None:
    two = Observation(ready=False, exits=(T0 + 1, T0 + 2), last_exit="the inference server exited with code 1")
    assert not verdict(two, T0 + 3).terminal
    three = Observation(ready=False, exits=(T0 + 1, T0 + 2, T0 + 3), last_exit="x", exited_role="worker")
    loop = verdict(three, T0 + 4)
    assert loop.state == states.CONTAINER_RESTART_LOOP and loop.source == "utils"
    # Old exits fall out of the window.
    assert verdict(attrs.evolve(three, ready=True), T0 + 101.5).state == states.RUNNING


def test_never_ready_times_out() -> None:
    assert not verdict(Observation(ready=False), T0 + 59).terminal
    late = verdict(Observation(ready=False, detail="inference unhealthy"), T0 + 61)
    assert late.state == states.DEGRADED_WORKER and "inference unhealthy" in late.detail


def test_ready_then_not_ready_degrades_after_the_period() -> None:
    lapse = verdict(Observation(ready=False, detail="503"), T0 + 100, ready_at=T0 + 10, not_ready_since=T0 + 80)
    # Not serving, but not failed yet: starting (not in the pool), fulfilled (it had been).
    assert (lapse.state, lapse.status, lapse.terminal) == (states.STARTING, states.FULFILLED, False)
    gone = verdict(Observation(ready=False, detail="503"), T0 + 111, ready_at=T0 + 10, not_ready_since=T0 + 80)
    assert gone.state == states.DEGRADED_WORKER and gone.terminal
    # A start timeout no longer applies once it has been ready.
    back = verdict(Observation(ready=True), T0 + 500, ready_at=T0 + 10, not_ready_since=T0 + 480)
    assert back.state == states.RUNNING
