"""``nvcf-mono --help`` and the light commands load no server code (issue: the CLI starts in under 0.3 s).

Checked by what is imported, not by timing: each command runs as the console script does, in a
fresh interpreter, which then reports every module in ``sys.modules``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

#: Packages that only a running host, plane or worker needs (each costs tenths of a second to import).
HEAVY = (
    "nvcf_mono.host",
    "nvcf_mono.planes",
    "nvcf_mono.bus",
    "nvcf_mono.worker",
    "nvcf_mono.http",
    "nvcf_mono.grpc",
    "nvcf_mono.config.load",
    "aiohttp",
    "grpclib",
    "betterproto",
    "nats",
    "kubernetes_asyncio",
)

_RUN = """
import json, runpy, sys
report, sys.argv = sys.argv[1], ["nvcf-mono", *sys.argv[2:]]
try:
    runpy.run_module("nvcf_mono", run_name="__main__", alter_sys=True)
except SystemExit as stop:
    code = stop.code
with open(report, "w") as out:
    json.dump({"code": code, "modules": sorted(sys.modules)}, out)
"""


def imported_by(tmp_path: Path, *argv: str, env: dict[str, str] | None = None) -> tuple[int, str, set[str]]:
    """Run ``nvcf-mono ARGV`` in a fresh interpreter: its exit code, its stderr, the modules it imported."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("NVCF_", "PYTHON"))}
    environ.update(env or {})
    report = tmp_path / "modules.json"
    result = subprocess.run(
        [sys.executable, "-c", _RUN, str(report), *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env=environ,
        cwd=ROOT,
    )
    assert result.returncode == 0 and report.exists(), result.stderr[-2000:]
    doc = json.loads(report.read_text())
    return doc["code"], result.stderr, set(doc["modules"])


def heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY))


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["function", "list", "--help"],
        ["deploy", "create", "--help"],
        ["invoke", "--help"],
        ["task", "--help"],
        ["up", "--help"],
        ["worker", "--help"],
        ["config", "show", "--help"],
    ],
    ids=" ".join,
)
def test_help_imports_no_server_code(tmp_path: Path, argv: list[str]) -> None:
    code, stderr, modules = imported_by(tmp_path, *argv)
    assert code == 0, stderr
    assert "nvcf_mono.cli" in modules
    assert heavy(modules) == []


def test_an_api_command_runs_without_server_code(tmp_path: Path) -> None:
    code, stderr, modules = imported_by(
        tmp_path, "function", "list", env={"NVCF_API_URL": "ftp://example.com", "NVCF_MONO_STATE_DIR": str(tmp_path)}
    )
    assert code == 2 and "expected an http:// or https:// URL" in stderr
    assert "nvcf_mono.cli.function_cmds" in modules and "nvcf_mono.cli.deploy_cmds" not in modules
    assert heavy(modules) == []


def test_the_guard_sees_heavy_imports(tmp_path: Path) -> None:
    """A command that does load the configuration's plugins is seen doing so (the checks above can fail)."""
    code, stderr, modules = imported_by(tmp_path, "config", "check", "--role", "control")
    assert code == 0, stderr
    assert "nvcf_mono.config.load" in heavy(modules) and "nvcf_mono.planes.control.plugin" in modules
