"""Run ``nvcf-mono``: in this process (``cli.main(argv, context)``), or as a child process the way users do.

Commands that only print and exit run in-process: same parser, same code, same output and exit code,
with the environment handed in explicitly. A child process is kept for what only a process shows:
the console script itself, signals, a platform started with ``up``, output arriving through a pipe.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nvcf_mono.cli import main
from nvcf_mono.cli.context import CliContext
from tests.support.procs import live_processes

ROOT = Path(__file__).resolve().parents[2]


def cli_env(**extra: str) -> dict[str, str]:
    """The test's environment, without NVCF_MONO__ overrides, with the repo importable (test plugins)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVCF_MONO__")}
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


def _no_host(*_: object) -> int:
    raise AssertionError("a command run in-process must not start a host: start `up` as a child process")


class _Terminal(io.TextIOWrapper):
    """A stdout that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def run_cli_bytes(
    *args: str, env: Mapping[str, str] | None = None, tty: bool = False, stdin: bytes | None = None
) -> subprocess.CompletedProcess[bytes]:
    """Run a command to completion in this process; stdout as the bytes a pipe (or, ``tty``, a terminal)
    would carry."""
    raw = io.BytesIO()
    kind = _Terminal if tty else io.TextIOWrapper
    out = kind(raw, encoding="utf-8", write_through=True)  # with a byte buffer, as sys.stdout has
    err = io.StringIO()
    given = io.BytesIO(stdin) if stdin is not None else None
    ctx = CliContext(environ=dict(env or cli_env()), stdout=out, stderr=err, run_host=_no_host, stdin=given)
    code = main(list(args), ctx)
    out.flush()
    return subprocess.CompletedProcess(["nvcf-mono", *args], code, raw.getvalue(), err.getvalue().encode())


def run_cli(
    *args: str, env: Mapping[str, str] | None = None, tty: bool = False, stdin: bytes | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a command to completion in this process (call it from a thread while a platform serves here)."""
    done = run_cli_bytes(*args, env=env, tty=tty, stdin=stdin)
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout.decode(), done.stderr.decode())


def fast_flags(state_dir: Path) -> list[str]:
    """Free ports and a private state directory, so tests never collide."""
    return [
        "--state-dir",
        str(state_dir),
        "--set",
        "http.port=0",
        "--set",
        "grpc.port=0",
        "--set",
        "embedded_nats.port=0",
    ]


class Platform:
    """A running ``nvcf-mono`` child process."""

    def __init__(
        self,
        args: list[str],
        state_dir: Path,
        *,
        env: dict[str, str] | None = None,
        command: list[str] | None = None,
        new_session: bool = False,
        cwd: Path = ROOT,
    ) -> None:
        self.state_dir = cwd / state_dir
        self.stdout_path = self.state_dir.parent / f"{self.state_dir.name}.stdout"
        self.stderr_path = self.state_dir.parent / f"{self.state_dir.name}.stderr"
        self._out = self.stdout_path.open("w")
        self._err = self.stderr_path.open("w")
        self.proc = subprocess.Popen(
            command or [sys.executable, "-m", "nvcf_mono", *args],
            stdout=self._out,
            stderr=self._err,
            env=env or cli_env(),
            cwd=cwd,
            start_new_session=new_session,
        )

    @property
    def endpoints_path(self) -> Path:
        return self.state_dir / "endpoints.json"

    def wait_ready(self, timeout: float = 60) -> dict[str, Any]:
        """Wait until /ready answers 200 (endpoints.json is written when the host is ready)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"nvcf-mono exited with {self.proc.returncode}:\n{self.stderr()}")
            if self.endpoints_path.exists():
                doc: dict[str, Any] = json.loads(self.endpoints_path.read_text())
                if get(doc["node_url"] + "/ready")[0] == 200:
                    return doc
            time.sleep(0.05)
        raise AssertionError(f"not ready within {timeout}s:\n{self.stderr()}")

    def wait_for_log(self, text: str, timeout: float = 30) -> None:
        """Wait until the platform's log says ``text`` (a state it reached), not for a fixed time."""
        deadline = time.monotonic() + timeout
        while text not in self.stderr():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"the log never said {text!r}:\n{self.stderr()[-3000:]}")
            time.sleep(0.02)

    def signal(self, signum: int = signal.SIGTERM) -> None:
        self.proc.send_signal(signum)

    def signal_group(self, signum: int) -> None:
        """Signal the whole process group, as a terminal's Ctrl-C does."""
        os.killpg(self.proc.pid, signum)

    def wait(self, timeout: float = 30) -> int:
        return self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        """Stop it if still running (SIGTERM: it stops its embedded NATS too; SIGKILL if that hangs)
        and release the log files."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc.wait()
        self._out.close()
        self._err.close()

    def stdout(self) -> str:
        return self.stdout_path.read_text()

    def stderr(self) -> str:
        return self.stderr_path.read_text()


def get(url: str, timeout: float = 5) -> tuple[int, bytes]:
    """(status, body) of a GET; connection errors give status 0."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()
    except (urllib.error.URLError, OSError):
        return 0, b""


def processes_naming(text: str) -> list[int]:
    """Pids of the live (not zombie) processes whose command line contains ``text``."""
    return [proc.pid for proc in live_processes() if text in proc.cmdline().decode(errors="replace")]


def nats_servers_on(state_dir: Path) -> list[int]:
    """Pids of nats-server processes running on this state directory's store."""
    marker = str(state_dir.resolve() / "nats")
    return [pid for pid in processes_naming(marker) if "nats-server" in _cmdline(pid)]


def _cmdline(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""
