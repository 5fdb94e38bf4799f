"""A task as a user runs one: `nvcf-mono up` (a child process), then the task commands against it (in-process)."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from tests.e2e.cli import Platform, cli_env, fast_flags, run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_create_wait_results_and_logs_of_the_example_task(tmp_path: Path) -> None:
    state = tmp_path / "state"
    flags = [*fast_flags(state), "--set", "plugins.control.example_function=false"]
    platform = Platform(["up", *flags], state)
    try:
        platform.wait_ready()
        conn = ["--state-dir", str(state)]
        env = cli_env()
        deadline = time.monotonic() + 30
        while "local" not in run_cli("cluster", "list", *conn, env=env).stdout:  # the agent registers just after
            assert time.monotonic() < deadline, "the local cluster never registered"
            time.sleep(0.2)
        created = run_cli(
            "task", "create", "--name", "squares", "--image", "task-example", "--args=--steps 3 --seconds 1.5",
            "--gpu", "H100", "--instance-type", "ON-PREM.GPU.H100_1x", "--wait", "--timeout", "120", "--json", *conn,
            env=env,
        )  # fmt: skip
        assert created.returncode == 0, created.stderr
        task = json.loads(created.stdout)["task"]
        assert task["status"] == "COMPLETED" and task["percentComplete"] == 100
        assert "COMPLETED 100%" in created.stderr  # the progress it showed on the way

        events = run_cli("task", "events", task["id"], *conn, env=env)
        assert events.returncode == 0 and "Changing status from 'RUNNING' to 'COMPLETED'" in events.stdout

        out = tmp_path / "out"
        results = run_cli("task", "results", task["id"], "--download", str(out), *conn, env=env)
        assert results.returncode == 0, results.stderr
        assert json.loads((out / "squares.json").read_text()) == {"squares": [1, 4, 9]}

        logs = run_cli("task", "logs", task["id"], *conn, env=env)
        assert logs.returncode == 0, logs.stderr
        assert "step 3/3" in logs.stdout

        platform.signal(signal.SIGTERM)
        assert platform.wait(timeout=30) == 0
        assert "Traceback" not in platform.stderr()
    finally:
        platform.stop()
