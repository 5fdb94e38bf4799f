"""``nvcf-mono up-split``: the control, invocation and compute roles as processes of their own on one machine.

It does what the README's "Splitting the planes on one machine" does by hand, so that page stays
true: a JetStream nats-server on loopback, one platform secret, then ``nvcf-mono run`` with each
file of ``config/split/`` in a state directory of its own. Their output is shown prefixed with the
role. Ctrl-C (SIGTERM) drains the three roles and stops NATS last; a second one stops them at once.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import anyio
import anyio.abc
import attrs

from nvcf_mono.cli.client import positive_float
from nvcf_mono.cli.commands import help_of
from nvcf_mono.cli.context import CliContext, CliError

ROLES = ("control", "invocation", "compute")
#: The roles that hold keys, tokens and sealed secrets: they share the platform secret.
SECRET_ROLES = ("control", "invocation")
DEFAULT_STATE = Path(".nvcf-mono-split")
#: How long a role gets to drain after the first signal before it is killed.
STOP_TIMEOUT = 60.0


def register(sub: Any) -> None:
    """Add ``up-split``."""
    up = sub.add_parser(
        "up-split",
        help=help_of("up-split"),
        description="Run a split deployment on this machine: a JetStream nats-server on 127.0.0.1, then the "
        "control, invocation and compute roles as three processes (nvcf-mono run with the files in "
        "--config-dir), each with a state directory under --state-dir and the platform secret they share. "
        "The CLI reads <state-dir>/control/endpoints.json and sends each command to the node that serves it. "
        "Ctrl-C drains and stops.",
    )
    up.add_argument(
        "--config-dir",
        type=Path,
        default=Path("config/split"),
        metavar="DIR",
        help="holds control.yaml, invocation.yaml and compute.yaml (default config/split)",
    )
    up.add_argument(
        "--state-dir",
        type=Path,
        default=DEFAULT_STATE,
        metavar="DIR",
        help=f"NATS store, platform secret and one directory per role (default {DEFAULT_STATE})",
    )
    up.add_argument("--nats-port", type=int, default=4222, metavar="PORT", help="NATS client port (default 4222)")
    up.add_argument(
        "--ready-timeout",
        type=positive_float,
        default=180.0,
        metavar="SECONDS",
        help="give up when a role is not ready by then (default 180)",
    )
    up.set_defaults(func=_up_split)


@attrs.frozen
class _Plan:
    nats_binary: Path
    nats_port: int
    base: Path
    configs: dict[str, Path]
    ready_timeout: float

    @property
    def nats_url(self) -> str:
        return f"nats://127.0.0.1:{self.nats_port}"

    @property
    def secret_file(self) -> Path:
        return self.base / "platform-secret"

    def state_dir(self, role: str) -> Path:
        return self.base / role

    def nats_command(self) -> list[str]:
        store = self.base / "nats"
        return [str(self.nats_binary), "-js", "-a", "127.0.0.1", "-p", str(self.nats_port), "-sd", str(store)]

    def role_command(self, role: str) -> list[str]:
        command = [sys.executable, "-m", "nvcf_mono", "run", "--config", str(self.configs[role])]
        command += ["--state-dir", str(self.state_dir(role)), "--set", f"bus.url={self.nats_url}"]
        if role in SECRET_ROLES:
            command += ["--set", f"plugins.auth.secret_file={self.secret_file}"]
        return command


def _up_split(args: argparse.Namespace, ctx: CliContext) -> int:
    from nvcf_mono.auth.secret import PlatformSecret
    from nvcf_mono.bus.embedded import EmbeddedNatsError, find_nats_server
    from nvcf_mono.ports import port_is_free
    from nvcf_mono.state_dir import ensure_private_dir

    configs = {role: args.config_dir / f"{role}.yaml" for role in ROLES}
    missing = [str(path) for path in configs.values() if not path.is_file()]
    if missing:
        raise CliError(f"missing role configuration: {', '.join(missing)} (run from the repository, or --config-dir)")
    if not 1 <= args.nats_port <= 65535:
        raise CliError(f"--nats-port {args.nats_port}: expected 1-65535")
    if not port_is_free("127.0.0.1", args.nats_port):
        raise CliError(
            f"port {args.nats_port} is in use (another NATS, or an up-split already running?): stop it or pass "
            "--nats-port"
        )
    try:
        binary = find_nats_server(None)
    except EmbeddedNatsError as err:
        raise CliError(str(err)) from err
    try:
        ensure_private_dir(args.state_dir)
        secret_file = args.state_dir / "platform-secret"
        if not secret_file.exists():
            PlatformSecret.generate().write(secret_file)
    except OSError as err:
        raise CliError(f"cannot prepare {args.state_dir}: {err.strerror or err}", code=1) from err
    plan = _Plan(binary, args.nats_port, args.state_dir, configs, args.ready_timeout)
    return anyio.run(_supervise, plan, ctx, backend="asyncio")


class _Failed(Exception):
    """A process of the deployment failed; the message says which and how."""


async def _supervise(plan: _Plan, ctx: CliContext) -> int:
    out = ctx.stderr
    procs: dict[str, asyncio.subprocess.Process] = {}
    return_code = 0
    # The relays outlive the deployment's task group: a role that drains still writes its log.
    async with anyio.create_task_group() as relays:
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_until_signal, tg.cancel_scope, out, name="up-split:signals")
                await _start(plan, procs, relays, out)
                tg.start_soon(_watch_exits, procs, name="up-split:exits")
                docs = await _wait_ready(plan)
                with anyio.fail_after(plan.ready_timeout):
                    await _wait_cluster(docs["control"])
                print(_banner(plan, docs), file=ctx.stdout, flush=True)
                await anyio.sleep_forever()
        except* _Failed as group:
            for err in group.exceptions:
                print(f"up-split: {err}", file=out, flush=True)
            return_code = 1
        except* TimeoutError:
            print(
                f"up-split: NATS, a role or the cluster was not ready within {plan.ready_timeout:g}s",
                file=out,
                flush=True,
            )
            return_code = 1
        finally:
            with anyio.CancelScope(shield=True):
                await _stop(procs)
            # The relays end with the roles' output; instances that kept a copy of it get a moment.
            relays.cancel_scope.deadline = anyio.current_time() + 5
    return return_code


async def _start(
    plan: _Plan, procs: dict[str, asyncio.subprocess.Process], relays: anyio.abc.TaskGroup, out: IO[str]
) -> None:
    """NATS, once JetStream answers; then the three roles (which retry the bus until it is there)."""
    from nvcf_mono.bus.embedded import jetstream_answers

    nats_log = plan.base / "nats.log"
    with nats_log.open("ab") as log_file:
        procs["nats"] = await _spawn(plan.nats_command(), stdout=log_file)
    with anyio.fail_after(30):
        while not await jetstream_answers(plan.nats_url, timeout=2):
            if procs["nats"].returncode is not None:
                raise _Failed(f"nats-server exited with code {procs['nats'].returncode}; see {nats_log}")
            await anyio.sleep(0.1)
    for role in ROLES:
        # Written again by the role once it is ready: its appearance is the readiness signal.
        (plan.state_dir(role) / "endpoints.json").unlink(missing_ok=True)
        procs[role] = proc = await _spawn(plan.role_command(role), stdout=subprocess.PIPE)
        relays.start_soon(_relay, role, proc, out, name=f"up-split:{role}-output")


async def _until_signal(scope: anyio.CancelScope, out: IO[str]) -> None:
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            print(f"up-split: {signal.Signals(signum).name}: draining the roles", file=out, flush=True)
            scope.cancel()
            return


async def _spawn(command: Sequence[str], *, stdout: int | IO[bytes]) -> asyncio.subprocess.Process:
    from nvcf_mono.bus.embedded import die_with_parent

    try:
        # A session of its own: a terminal's Ctrl-C reaches this supervisor only, which drains the roles
        # once; die_with_parent: a supervisor killed outright takes them with it.
        return await asyncio.create_subprocess_exec(
            *command,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent(os.getpid()),
            start_new_session=True,
        )
    except OSError as err:
        raise _Failed(f"cannot start {command[0]}: {err}") from err


async def _relay(role: str, proc: asyncio.subprocess.Process, out: IO[str]) -> None:
    """Copy a role's output, each line prefixed with the role."""
    assert proc.stdout is not None
    prefix = f"[{role}] "
    async for line in proc.stdout:
        out.write(prefix + line.decode(errors="replace"))
        out.flush()


async def _watch_exits(procs: dict[str, asyncio.subprocess.Process]) -> None:
    """Fail the deployment when any of its processes ends before being asked to."""
    while True:
        for name, proc in procs.items():
            if proc.returncode is not None:
                raise _Failed(f"{name} exited with code {proc.returncode} (its output above says why)")
        await anyio.sleep(0.2)


async def _wait_ready(plan: _Plan) -> dict[str, Any]:
    """Each role's endpoints.json, written by it once it is ready."""
    docs: dict[str, Any] = {}
    with anyio.fail_after(plan.ready_timeout):
        while len(docs) < len(ROLES):
            for role in ROLES:
                path = plan.state_dir(role) / "endpoints.json"
                if role not in docs and path.exists():
                    try:
                        docs[role] = json.loads(path.read_text())
                    except ValueError:
                        continue  # being written
            await anyio.sleep(0.2)
    return docs


async def _wait_cluster(control: dict[str, Any]) -> None:
    """Until the compute node's cluster has registered with the control node: ready means a deploy works."""
    from nvcf_mono.cli.client import ApiClient, Credential

    origin = "the control node's endpoints.json"
    token = Credential(str((control.get("credentials") or {}).get("admin_token", "")), "token", origin)
    client = ApiClient(
        str(control.get("api_url")), origin, token=token, api_key=None, timeout=5, proxies={},
        ca_file=control.get("ca_file") or None,
    )  # fmt: skip

    def groups() -> list[Any]:
        try:
            return list((client.get("/v2/nvcf/clusterGroups") or {}).get("clusterGroups") or ())
        except CliError:
            return []  # not answering yet: asked again

    while True:
        if any(group.get("clusters") for group in await anyio.to_thread.run_sync(groups)):
            return
        await anyio.sleep(0.2)  # an HTTP answer, not an event: asked again


async def _stop(procs: dict[str, asyncio.subprocess.Process]) -> None:
    """Compute first, so its instances stop and are reported while the other roles still run; then the
    invocation and control roles; NATS last. Each drains on SIGTERM; a second Ctrl-C stops all at once.
    """
    hurry = anyio.Event()
    for names in (("compute",), ("invocation", "control"), ("nats",)):
        await _terminate([procs[name] for name in names if name in procs], hurry)


async def _terminate(procs: list[asyncio.subprocess.Process], hurry: anyio.Event) -> None:
    running = [proc for proc in procs if proc.returncode is None]
    for proc in running:
        _signal(proc, signal.SIGKILL if hurry.is_set() else signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT
    with anyio.CancelScope() as scope, anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:

        async def again() -> None:
            async for _ in signals:  # a second Ctrl-C: stop at once, these and the rest
                hurry.set()
                for proc in running:
                    _signal(proc, signal.SIGKILL)

        async with anyio.create_task_group() as tg:
            tg.start_soon(again)
            for proc in running:
                with anyio.move_on_after(max(0.0, deadline - time.monotonic())):
                    await proc.wait()
                if proc.returncode is None:
                    _signal(proc, signal.SIGKILL)
                    await proc.wait()
            tg.cancel_scope.cancel()
        scope.cancel()


def _signal(proc: asyncio.subprocess.Process, signum: int) -> None:
    try:
        proc.send_signal(signum)
    except ProcessLookupError:
        pass


def _banner(plan: _Plan, docs: dict[str, Any]) -> str:
    control, invocation, compute = (docs[role] for role in ROLES)
    state = plan.state_dir("control")
    return "\n".join(
        [
            "nvcf-mono split deployment is ready: four processes on this machine",
            f"  NATS        {plan.nats_url} (JetStream, store {plan.base / 'nats'}, log {plan.base / 'nats.log'})",
            f"  control     {control.get('node_url')} (management API; state {state})",
            f"  invocation  {invocation.get('node_url')} (pexec, exec, LLM gateway; gRPC {invocation.get('grpc_url')})",
            f"  compute     {compute.get('node_url')} (health and metrics; instances run on this machine)",
            f"  CLI         export NVCF_MONO_STATE_DIR={state}   (each command goes to the node that serves it)",
            "Ctrl-C drains and stops.",
        ]
    )
