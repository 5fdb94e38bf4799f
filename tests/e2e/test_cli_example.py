"""``nvcf-mono example NAME``: the examples served by the console script (what the platform's image runs
for a function with ``containerArgs: "example llm ..."``)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from nvcf_mono.ports import spare_port
from tests.e2e.cli import cli_env, get, run_cli

pytestmark = [pytest.mark.e2e]


def test_the_llm_example_serves_on_the_port_it_is_given_and_on_the_contracts_port() -> None:
    port, env_port = spare_port(), spare_port()
    servers = [
        subprocess.Popen([sys.executable, "-m", "nvcf_mono", "example", "llm", "--port", str(port)], env=cli_env()),
        # The instance contract's INFERENCE_PORT when no --port is given.
        subprocess.Popen(
            [sys.executable, "-m", "nvcf_mono", "example", "llm", "--model", "other"],
            env=cli_env(INFERENCE_PORT=str(env_port)),
        ),
    ]
    try:
        for at, model in ((port, "tiny-llm"), (env_port, "other")):
            deadline = time.monotonic() + 30
            while (answer := get(f"http://127.0.0.1:{at}/v1/models"))[0] != 200:
                assert time.monotonic() < deadline and all(s.poll() is None for s in servers), "not serving"
                time.sleep(0.1)
            assert [m["id"] for m in json.loads(answer[1])["data"]] == [model]
    finally:
        for server in servers:
            server.terminate()
            server.wait(timeout=10)


def test_an_unknown_example_is_a_usage_error_naming_the_ones_there_are() -> None:
    done = run_cli("example", "nope")
    assert done.returncode == 2
    assert "invalid choice: 'nope'" in done.stderr and "llm" in done.stderr
