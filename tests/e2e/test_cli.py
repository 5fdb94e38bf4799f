"""The command line as users meet it: config errors, config show/check/reference, plugins.

In-process (``cli.main``), but for the console script itself, run as users run it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from nvcf_mono.registry import discover
from tests.e2e.cli import ROOT, cli_env, run_cli


@pytest.mark.e2e
def test_the_console_script_reads_argv_and_the_environment(tmp_path: Path) -> None:
    """The installed ``nvcf-mono`` script: its exit code, its stderr, the process environment reaching the config."""
    script = Path(sys.executable).parent / "nvcf-mono"
    env = cli_env(NVCF_MONO__HTTP__PORT="eighty")
    result = subprocess.run(
        [str(script), "run", "--state-dir", str(tmp_path / "s")],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=ROOT,
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        "nvcf-mono: config: http.port: expected an integer, got 'eighty' (from env NVCF_MONO__HTTP__PORT)"
    ]
    assert result.stdout == ""
    listed = subprocess.run(
        [str(script), "--help"], capture_output=True, text=True, timeout=60, env=cli_env(), cwd=ROOT
    )
    assert listed.returncode == 0
    assert re.search(r"^ +invoke +invoke a function and print its response$", listed.stdout, re.M), listed.stdout
    assert not (tmp_path / "s").exists()


@pytest.mark.e2e
def test_a_reader_that_stops_early_gets_no_traceback() -> None:
    """``nvcf-mono config reference | true``: the reader is gone before the command prints."""
    script = Path(sys.executable).parent / "nvcf-mono"
    read_end, write_end = os.pipe()
    os.close(read_end)
    with subprocess.Popen(
        [str(script), "config", "reference"], stdout=write_end, stderr=subprocess.PIPE, env=cli_env(), cwd=ROOT
    ) as proc:
        os.close(write_end)
        _, stderr = proc.communicate(timeout=60)
    assert stderr.decode() == ""
    assert proc.returncode == 141  # as a process a SIGPIPE stopped: `set -o pipefail` still sees it


@pytest.mark.parametrize(
    ("args", "env", "line"),
    [
        (
            ["--set", "htp.port=1"],
            {},
            "nvcf-mono: config: htp: unknown key (did you mean 'http'?) (from --set htp.port)",
        ),
        (
            [],
            {"NVCF_MONO__HTTP__PORT": "eighty"},
            "nvcf-mono: config: http.port: expected an integer, got 'eighty' (from env NVCF_MONO__HTTP__PORT)",
        ),
        (
            ["--role", "everything"],
            {},
            "nvcf-mono: config: role: unknown role 'everything' (known: all-in-one, compute, control, custom, "
            "invocation) (from --role)",
        ),
        (
            ["--set", "plugins.nope.enabled=true"],
            {},
            "nvcf-mono: config: plugins.nope: unknown plugin (installed: "
            + ", ".join(sorted(discover()[0].plugins))
            + ") (from --set plugins.nope.enabled)",
        ),
    ],
    ids=["unknown-key", "wrong-type", "unknown-role", "unknown-plugin"],
)
def test_config_errors_exit_2_with_one_clear_line(
    tmp_path: Path, args: list[str], env: dict[str, str], line: str
) -> None:
    result = run_cli("run", "--state-dir", str(tmp_path / "s"), *args, env=cli_env(**env))
    assert result.returncode == 2
    assert result.stderr.splitlines() == [line]
    assert result.stdout == ""
    assert not (tmp_path / "s").exists()  # nothing was started or written


def test_every_problem_gets_its_own_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("http:\n  port: x\ngrpc:\n  port: y\n")
    result = run_cli("up", "--config", str(bad))
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"nvcf-mono: config: http.port: expected an integer, got str 'x' (from {bad})",
        f"nvcf-mono: config: grpc.port: expected an integer, got str 'y' (from {bad})",
    ]


def test_config_show_resolved_prints_the_effective_config() -> None:
    result = run_cli("config", "show", "--resolved", "--set", "http.port=9999", "--role", "control")
    assert result.returncode == 0, result.stderr
    data = yaml.safe_load(result.stdout)
    assert data["version"] == 1
    assert data["role"] == "control"
    assert data["http"]["port"] == 9999
    assert data["plugins"]["control"]["enabled"] is True
    assert data["plugins"]["compute"]["enabled"] is False
    assert data["shutdown"]["drain_grace"] == 10.0


def test_config_show_without_resolved_prints_only_what_was_set(tmp_path: Path) -> None:
    mine = tmp_path / "mine.yaml"
    mine.write_text("http:\n  port: 9000\n")
    result = run_cli("config", "show", "--config", str(mine), "--set", "node.region=eu")
    assert result.returncode == 0, result.stderr
    assert yaml.safe_load(result.stdout) == {"http": {"port": 9000}, "node": {"region": "eu"}}


def test_config_check_and_reference() -> None:
    ok = run_cli("config", "check", "--config", str(ROOT / "config" / "invocation.yaml"))
    assert ok.returncode == 0
    assert ok.stdout.strip().startswith("configuration is valid: role invocation, plugins ")
    enabled = ok.stdout.strip().split("plugins ", 1)[1].split(", ")
    assert "invocation" in enabled and "control" not in enabled and "compute" not in enabled
    reference = run_cli("config", "reference")
    assert reference.returncode == 0
    assert reference.stdout == (ROOT / "config" / "reference.yaml").read_text()


def test_plugins_lists_what_is_enabled_and_why() -> None:
    result = run_cli("plugins", "--json", "--role", "compute")
    assert result.returncode == 0, result.stderr
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    assert rows["compute"]["enabled"] is True and rows["compute"]["why"] == "role compute"
    assert rows["control"]["enabled"] is False
    assert rows["control"]["origin"] == "entry point nvcf_mono.planes.control.plugin:ControlPlane"


def test_bad_set_syntax_and_no_command() -> None:
    result = run_cli("run", "--set", "novalue")
    assert result.returncode == 2
    assert result.stderr.strip() == "nvcf-mono: --set 'novalue': expected KEY=VALUE, e.g. --set http.port=0"
    assert run_cli().returncode == 2


def test_secret_generate_writes_a_private_file_and_refuses_to_overwrite(tmp_path: Path) -> None:
    target = tmp_path / "platform-secret"
    made = run_cli("secret", "generate", str(target))
    assert made.returncode == 0 and "fingerprint" in made.stdout
    assert oct(target.stat().st_mode & 0o777) == "0o600"
    printed = run_cli("secret", "fingerprint", str(target))
    assert printed.returncode == 0 and printed.stdout.strip() in made.stdout
    again = run_cli("secret", "generate", str(target))
    assert again.returncode == 2 and "exists" in again.stderr
