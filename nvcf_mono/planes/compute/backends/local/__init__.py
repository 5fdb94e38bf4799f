"""The local backend: an instance is its inference server process plus ``nvcf-mono worker`` beside it.

Like a Pod with ``restartPolicy: Always``, a process that exits is started again after a backoff
(the agent counts the exits and calls a loop a loop). Each process leads its own session, so a
terminate reaches what it started, and instances outlive an agent killed with SIGKILL: the next
agent takes them over by pid and start time. Each instance gets its own port, directory and logs,
and, when the agent runs as root, users of its own (``users.py``).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from functools import partial
from pathlib import Path
from typing import final

import aiohttp
import anyio
import attrs

from nvcf_mono.contracts import env, states
from nvcf_mono.contracts.agent import AgentInstance, AgentLog, AgentProcess
from nvcf_mono.contracts.messages import CreationMessage
from nvcf_mono.models.common import duration_seconds
from nvcf_mono.planes.compute import workload
from nvcf_mono.planes.compute.backends import BackendContext, ClusterFacts, LaunchSpec, WorkerEndpoint
from nvcf_mono.planes.compute.backends.local import processes
from nvcf_mono.planes.compute.backends.local.environment import (
    ADDRESS_FILE,
    Where,
    host_environment,
    inference_environment,
    worker_environment,
)
from nvcf_mono.planes.compute.backends.local.images import LaunchError, resolve
from nvcf_mono.planes.compute.backends.local.processes import Proc, exit_text, read_tail, spawn
from nvcf_mono.planes.compute.backends.local.users import InstanceUsers, Slot, run_as
from nvcf_mono.planes.compute.config import HealthSettings, Image, LocalSettings
from nvcf_mono.planes.compute.gpus import Inventory
from nvcf_mono.planes.compute.health import Completion, LaunchFailure, Observation
from nvcf_mono.planes.compute.log_shipping import LogShipper, Renewal, logs_target, resource_of
from nvcf_mono.plugin import PluginConfigError
from nvcf_mono.ports import spare_port
from nvcf_mono.state_dir import write_private
from nvcf_mono.worker.secrets import ContractSource

INFERENCE, WORKER = "inference", "worker"
LOGS = {INFERENCE: "inference.log", WORKER: "worker.log"}
_TITLE = {INFERENCE: "the inference server", WORKER: "the worker"}


@attrs.define(eq=False)
class LocalInstance:
    """One instance's processes and how to start them (again)."""

    instance_id: str
    directory: Path
    port: int | None
    health_port: int | None
    argv: dict[str, tuple[str, ...]] = attrs.field(factory=dict)
    envs: dict[str, dict[str, str]] = attrs.field(factory=dict)
    cwd: dict[str, Path] = attrs.field(factory=dict)
    procs: dict[str, Proc] = attrs.field(factory=dict)
    exits: list[float] = attrs.field(factory=list)
    last_exit: str = ""
    exited_role: str = ""
    #: role -> monotonic time at which it is started again
    due: dict[str, float] = attrs.field(factory=dict)
    streak: dict[str, int] = attrs.field(factory=dict)
    failure: LaunchFailure | None = None
    #: Monotonic time since which the inference server waits for the worker to write the secrets.
    secrets_wait: float | None = None
    stopped: bool = False
    fixed_port: int | None = None
    #: A task: its process runs once (never restarted); its end is the instance's end.
    run_once: bool = False
    max_runtime: float | None = None
    grace: float = 0.0
    #: Monotonic times: the task's process first started, and when its deadline sent it SIGTERM.
    task_started: float | None = None
    overtime_at: float | None = None
    #: Monotonic time since which the task's process waits for its worker to connect (a fast task
    #: would otherwise end before anyone reports its progress or uploads its results).
    worker_wait: float | None = None
    completion: Completion | None = None
    #: Every process started for the instance, so each is reaped when it is released, whatever path
    #: dropped it from ``procs``.
    spawned: list[Proc] = attrs.field(factory=list)
    #: The WorkerService address last written to the worker's address file.
    address: str = ""
    #: The users its processes run as (None: the platform's own).
    slot: Slot | None = None

    @property
    def processes(self) -> tuple[AgentProcess, ...]:
        return tuple(
            AgentProcess(role=p.role, pid=p.pid, start_ticks=p.ticks, started_at=p.started_at)
            for p in self.procs.values()
            if not p.ended
        )

    def log_path(self, role: str) -> Path:
        return self.directory / LOGS[role]

    def title(self, role: str) -> str:
        """What the process of ``role`` is called in logs and errors (a task's is no server)."""
        return "the task's process" if role == INFERENCE and self.run_once else _TITLE[role]

    def starting(self, role: str, again: bool) -> str:
        """The log's line as ``role``'s process is started (again)."""
        return f"starting {self.title(role)}{' again' if again else ''}"


class LocalBackend:
    """Runs instances as processes on this machine (container functions only)."""

    name = "local"
    capabilities: tuple[str, ...] = ()

    def __init__(
        self,
        *,
        catalog: Mapping[str, Image],
        environ: Mapping[str, str],
        health: HealthSettings,
        local: LocalSettings,
        log: logging.Logger,
        endpoint: WorkerEndpoint | None = None,
        state_dir: Path | None = None,
        telemetry_proxy: str | None = None,
    ) -> None:
        self._endpoint = endpoint or WorkerEndpoint()
        self._telemetry_proxy = telemetry_proxy
        self._catalog = dict(catalog)
        self._base = host_environment(environ)
        self._path = environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")
        self._health = health
        self._local = local
        self._log = log
        # -P: the instance's directory (its cwd) is not searched for modules; -s: nor is a user site.
        self._worker_argv = local.worker_command or (sys.executable, "-P", "-s", "-m", "nvcf_mono", "worker")
        self._state_dir = state_dir
        self._users = InstanceUsers(local, worker_argv=self._worker_argv, log=log)
        self._users_lock = anyio.Lock()
        self._reach_checked = 0.0
        self._ports: set[int] = set()
        self._fixed: dict[int, str] = {}
        self._http: aiohttp.ClientSession | None = None
        #: Instances started or taken over and not released yet.
        self._held: dict[str, LocalInstance] = {}
        self._shipper: LogShipper | None = None
        #: The HTTP client and the log shipping, held from __aenter__ to __aexit__.
        self._resources: AsyncExitStack | None = None

    async def __aenter__(self) -> LocalBackend:
        self._announce()
        # One stack, so that each part is let go whatever fails or is cancelled, here or at __aexit__.
        async with AsyncExitStack() as stack:
            self._http = await stack.enter_async_context(
                aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=True))
            )
            # The instances' output to their logs endpoints: a task group held from here to __aexit__.
            shipping = await stack.enter_async_context(anyio.create_task_group())
            stack.callback(shipping.cancel_scope.cancel)
            self._shipper = LogShipper(self._log, self._telemetry_proxy)
            await shipping.start(self._shipper.run)
            self._resources = stack.pop_all()
        return self

    async def __aexit__(self, *exc: object) -> None:
        # What is still held when the backend closes is left running (the next agent takes it over).
        for inst in self._held.values():
            for proc in inst.procs.values():
                proc.detach()
        self._held.clear()
        self._users.let_go()  # their running processes keep their users from others until the next agent
        resources, self._resources = self._resources, None
        try:
            if resources is not None:
                await resources.aclose()
        finally:
            self._shipper = self._http = None

    def _announce(self) -> None:
        self._users.announce(self._state_dir)

    # ---- what runs here ----------------------------------------------------------------------------

    def refuse(self, message: CreationMessage) -> LaunchFailure | None:
        if message.launch_specification.helm_chart:
            return LaunchFailure(
                cause=states.CREATE_CONTAINER_ERROR,
                detail="this cluster runs instances as local processes (backend 'local'), which cannot install "
                "Helm charts: deploy Helm functions to a cluster with the Kubernetes backend",
            )
        return workload.refusal(message)

    def _port(self) -> int:
        for _ in range(100):
            port = spare_port()  # bound by the instance later: none the kernel may hand out meanwhile
            if port not in self._ports:
                self._ports.add(port)
                return port
        raise LaunchError(states.CREATE_CONTAINER_ERROR, "no free port on this host")

    def _prepare(self, spec: LaunchSpec, inst: LocalInstance) -> None:
        """Resolve the image and build both environments (raises LaunchError)."""
        message = spec.message
        contract = message.launch_specification.environment
        image = workload.image_of(message)
        assert inst.port is not None and inst.health_port is not None
        command = resolve(
            self._catalog,
            image,
            contract.get(env.INFERENCE_CONTAINER_ARGS, ""),
            port=inst.port,
            python=sys.executable,
            instance_dir=spec.directory,
            path=self._path,
        )
        if command.fixed_port is not None:
            holder = self._fixed.get(command.fixed_port)
            if holder is not None and holder != inst.instance_id:
                raise LaunchError(
                    states.CREATE_CONTAINER_ERROR,
                    f"image {command.image!r} always listens on port {command.fixed_port} (images.{command.image}."
                    f"port), which instance {holder} uses: this image runs one instance per host",
                )
            self._ports.discard(inst.port)
            inst.port = inst.fixed_port = command.fixed_port
            self._fixed[command.fixed_port] = inst.instance_id
        where = Where(
            instance_id=inst.instance_id,
            cluster_id=spec.cluster_id,
            port=inst.port,
            health_port=inst.health_port,
            directory=spec.directory,
            devices=spec.allocation.devices if spec.allocation is not None else (),
            ready_timeout=self._health.start_timeout + 60,
            health_interval=min(self._health.probe_interval, 1.0),
            secrets_refresh=self._local.secrets_refresh,
            telemetry_proxy=self._telemetry_proxy,
        )
        inst.argv = {INFERENCE: command.argv, WORKER: tuple(self._worker_argv)}
        inst.cwd = {INFERENCE: command.cwd, WORKER: spec.directory}
        inst.envs = {
            INFERENCE: inference_environment(self._base, contract, command.env, where),
            WORKER: worker_environment(self._base, contract, where),
        }
        self._write_address(inst, self._endpoint.address or contract.get(env.NVCF_FQDN_GRPC, ""))
        if inst.slot is not None:
            inst.envs[INFERENCE]["HOME"] = str(spec.directory)  # its own: the platform's is closed to it
        if message.task_details is not None:
            self._as_task(inst, spec)

    @staticmethod
    def _as_task(inst: LocalInstance, spec: LaunchSpec) -> None:
        """A task: runs once, with the task contract (progress file, results directory) and its deadline."""
        launch = spec.message.launch_specification
        inst.run_once = True
        inst.max_runtime = duration_seconds(launch.max_runtime_duration) if launch.max_runtime_duration else None
        grace = launch.termination_grace_period_duration
        inst.grace = duration_seconds(grace) if grace else 0.0
        contract = launch.environment
        task_env = {
            env.NVCT_PROGRESS_FILE_PATH: str(spec.directory / "progress"),
            env.NVCT_RESULTS_DIR: str(spec.directory / "results"),
            **{k: contract[k] for k in (env.NVCT_TASK_ID, env.NVCT_TASK_NAME, env.NVCT_NCA_ID) if k in contract},
        }
        for role in (INFERENCE, WORKER):
            inst.envs[role].update(task_env)

    async def _open(self, spec: LaunchSpec, inst: LocalInstance) -> None:
        """The instance's users (instance users reach what they run) and its directory (raises LaunchError)."""
        try:
            async with self._users_lock:  # one probe, and one taker of users at a time
                await anyio.to_thread.run_sync(self._users.ready, spec.directory.parent, self._base)
                inst.slot = await anyio.to_thread.run_sync(self._users.take, inst.instance_id)
            await anyio.to_thread.run_sync(self._users.make_directory, spec.directory, inst.slot)
        except OSError as err:
            raise LaunchError(states.CREATE_CONTAINER_ERROR, f"cannot prepare the instance's directory: {err}") from err

    def _new_instance(self, spec: LaunchSpec, port: int | None, health_port: int | None) -> LocalInstance:
        return LocalInstance(instance_id=spec.instance_id, directory=spec.directory, port=port, health_port=health_port)

    async def start(self, spec: LaunchSpec) -> LocalInstance:
        inst = self._new_instance(spec, None, None)
        self._held[inst.instance_id] = inst
        try:
            await self._open(spec, inst)
            inst.port, inst.health_port = self._port(), self._port()
            self._prepare(spec, inst)
            await self._spawn(inst, WORKER)
            if inst.run_once:
                inst.worker_wait = time.monotonic()
            elif self._secrets_needed(inst):
                inst.secrets_wait = time.monotonic()  # the server starts once the worker wrote the secrets
            else:
                await self._spawn(inst, INFERENCE)
            self._ship_output(inst, from_end=False)
        except LaunchError as err:
            inst.failure = err.failure
            self._log.info("instance %s cannot start: %s", inst.instance_id, err.failure.detail)
        return inst

    def _ship_output(self, inst: LocalInstance, *, from_end: bool) -> None:
        """Send the instance's output to its function's or task's logs endpoint, when it chose one."""
        contract = inst.envs.get(WORKER, {})
        target = logs_target(contract)
        if target is not None and self._shipper is not None:
            resource = resource_of(contract, inst.instance_id)
            renewal = Renewal(ContractSource.of(contract), self._local.secrets_refresh)
            self._shipper.watch(
                inst.instance_id, inst.log_path(INFERENCE), target, resource, from_end=from_end, renewal=renewal
            )

    async def adopt(self, spec: LaunchSpec, recorded: AgentInstance) -> LocalInstance:
        inst = self._new_instance(spec, recorded.port, recorded.health_port)
        self._held[inst.instance_id] = inst
        try:
            async with self._users_lock:  # its users reach what they run, and it is kept so (keep_reachable)
                await anyio.to_thread.run_sync(self._users.ready, spec.directory.parent, self._base)
            inst.slot = self._users.adopt(spec.directory, inst.instance_id)
            if inst.slot is None:
                self._users.make_directory(spec.directory, None)
            if inst.port is None or inst.health_port is None:
                inst.port, inst.health_port = inst.port or self._port(), inst.health_port or self._port()
            self._ports.update({inst.port, inst.health_port})
            self._prepare(spec, inst)
        except LaunchError as err:
            inst.failure = err.failure
            return inst
        now = time.time()
        for rec in recorded.processes:
            taken = await self._take_over(inst, rec)
            if taken is not None:
                inst.procs[rec.role] = taken
                self._log.info("instance %s: took over %s (pid %d)", inst.instance_id, inst.title(rec.role), rec.pid)
        missing = [role for role in (WORKER, INFERENCE) if role not in inst.procs]
        if missing:
            # Gone while the agent was away: started again now, and counted like any exit.
            inst.exits.append(now)
            inst.last_exit = f"{inst.title(missing[0])} ended while the agent was not running"
            inst.exited_role = missing[0]
            for role in missing:
                inst.due[role] = time.monotonic()
        self._ship_output(inst, from_end=True)  # the agent before this one sent what was written until now
        return inst

    async def _take_over(self, inst: LocalInstance, rec: AgentProcess) -> Proc | None:
        """The recorded process, when it still runs for this instance."""
        proc = Proc(role=rec.role, pid=rec.pid, ticks=rec.start_ticks, started_at=rec.started_at)
        users = inst.slot.uids if inst.slot is not None else frozenset[int]()
        return proc if proc.is_same() and processes.belongs_to(rec.pid, inst.instance_id, users) else None

    def _secrets_file(self, inst: LocalInstance) -> Path:
        """Where the worker writes the instance's secrets."""
        return inst.directory / "secrets.json"

    def _secrets_needed(self, inst: LocalInstance) -> bool:
        present = inst.envs[WORKER].get(env.FUNCTION_SECRETS_PRESENT, "false").lower() == "true"
        return present and not self._secrets_file(inst).exists()

    def _umask(self, role: str) -> int | None:
        """The umask a process of ``role`` starts with when it runs as the platform's user (None: ours)."""
        return None

    async def _spawn(self, inst: LocalInstance, role: str, *, again: bool = False) -> None:
        argv, title = inst.argv[role], inst.title(role)
        user = run_as(inst.slot, role)
        try:
            proc = await anyio.to_thread.run_sync(
                partial(
                    spawn,
                    role,
                    argv=argv,
                    environment=inst.envs[role],
                    cwd=inst.cwd[role],
                    log_path=inst.log_path(role),
                    banner=f"{inst.starting(role, again)}: {' '.join(argv)}",
                    run_as=user,
                    umask=self._umask(role),
                )
            )
        except FileNotFoundError as err:
            cause = states.IMAGE_PULL_ISSUES if role == INFERENCE else states.CREATE_CONTAINER_ERROR
            raise LaunchError(cause, f"cannot start {title}: {argv[0]!r} was not found ({err})") from err
        except PermissionError as err:
            who = f" as uid {user.uid}" if user is not None else ""
            hint = (
                ": instance users must be able to reach and run it (search permission on every directory "
                "leading there, read and execute on the file)"
                if user is not None
                else ""
            )
            raise LaunchError(states.CREATE_CONTAINER_ERROR, f"cannot start {title}{who}: {err}{hint}") from err
        except OSError as err:
            raise LaunchError(states.CREATE_CONTAINER_ERROR, f"cannot start {title}: {err}") from err
        inst.procs[role] = proc
        inst.spawned.append(proc)
        if role == INFERENCE and inst.run_once and inst.task_started is None:
            inst.task_started = time.monotonic()

    # ---- watching ----------------------------------------------------------------------------------

    async def observe(self, handle: object) -> Observation:
        inst = _local(handle)
        await self._keep_reachable()
        if inst.failure is None and not inst.stopped:
            try:
                await self._tend(inst)
            except LaunchError as err:
                inst.failure = err.failure
        if inst.failure is not None:
            return Observation(ready=False, failure=inst.failure)
        if inst.completion is not None:
            return Observation(ready=False, completed=inst.completion)
        ready, detail = await self._probe(inst)
        if ready:
            inst.streak.clear()
        return Observation(
            ready=ready,
            detail=detail,
            exits=tuple(inst.exits),
            last_exit=inst.last_exit,
            exited_role=inst.exited_role,
        )

    async def _keep_reachable(self) -> None:
        """Every few seconds (not once per instance): instance users still reach what they were granted."""
        mono = time.monotonic()
        if mono - self._reach_checked < REACH_CHECK:
            return
        self._reach_checked = mono
        async with self._users_lock:
            await anyio.to_thread.run_sync(self._users.keep_reachable)

    def _write_address(self, inst: LocalInstance, address: str) -> None:
        """The worker reads the platform's address from this file before each connection."""
        if not address or address == inst.address:
            return
        path = inst.directory / ADDRESS_FILE
        try:  # atomically (a worker never reads half an address), readable by the worker's user
            write_private(path, address.encode(), mode=0o644)
        except OSError as err:
            self._log.warning("instance %s: cannot write %s: %s", inst.instance_id, path, err)
            return
        if inst.address:
            self._log.info("instance %s: the worker now dials %s (was %s)", inst.instance_id, address, inst.address)
        inst.address = address

    async def _tend(self, inst: LocalInstance) -> None:
        """Note exits, start again what is due, and start the server once its secrets are written."""
        if self._endpoint.address:
            self._write_address(inst, self._endpoint.address)
        now, mono = time.time(), time.monotonic()
        if inst.run_once:
            await self._enforce_deadline(inst, mono)
        for role, proc in list(inst.procs.items()):
            if proc.poll():
                continue
            del inst.procs[role]
            if proc.popen is not None:
                processes.kill_group(proc.pid, signal.SIGKILL)  # what it started dies with it
            if inst.run_once and role == INFERENCE:
                await self._task_ended(inst, proc)
                return
            what = exit_text(inst.title(role), proc)
            if proc.returncode == 127:
                raise LaunchError(states.IMAGE_PULL_ISSUES, f"{what} (command not found)")
            if proc.returncode == 126:
                raise LaunchError(states.CREATE_CONTAINER_ERROR, f"{what} (command not executable)")
            inst.exits.append(now)
            inst.exits[:] = inst.exits[-50:]
            inst.last_exit, inst.exited_role = what, role
            streak = inst.streak[role] = inst.streak.get(role, 0) + 1
            delay = min(self._health.restart_backoff * 2 ** (streak - 1), self._health.restart_backoff_max)
            inst.due[role] = mono + delay
            self._log.info("instance %s: %s; starting it again in %.1fs", inst.instance_id, what, delay)
        if inst.secrets_wait is not None:
            if self._secrets_file(inst).exists():
                inst.secrets_wait = None
                inst.due[INFERENCE] = mono
            elif WORKER not in inst.procs and WORKER not in inst.due:
                raise LaunchError(states.INIT_CONTAINER_STUCK, "the worker ended before it wrote the secrets")
            elif mono - inst.secrets_wait > self._local.secrets_timeout:
                raise LaunchError(
                    states.INIT_CONTAINER_STUCK,
                    f"the worker did not fetch the instance's secrets within {self._local.secrets_timeout:g}s",
                )
        if inst.worker_wait is not None:
            await self._await_task_worker(inst, mono)
        for role, when in sorted(inst.due.items()):
            held = inst.secrets_wait is not None or inst.worker_wait is not None
            if mono < when or (role == INFERENCE and held):
                continue
            del inst.due[role]
            again = role in inst.streak or role == inst.exited_role
            await self._spawn(inst, role, again=again)

    async def _await_task_worker(self, inst: LocalInstance, mono: float) -> None:
        """Start the task's process once its worker is connected (it has fetched the secrets by then)."""
        assert inst.worker_wait is not None
        if await self._worker_ready(inst):
            inst.worker_wait = None
            inst.due[INFERENCE] = mono
        elif WORKER not in inst.procs and WORKER not in inst.due:
            raise LaunchError(states.INIT_CONTAINER_STUCK, "the task's worker ended before it connected")
        elif mono - inst.worker_wait > self._local.secrets_timeout:
            raise LaunchError(
                states.INIT_CONTAINER_STUCK,
                f"the task's worker did not connect within {self._local.secrets_timeout:g}s",
            )

    async def _worker_ready(self, inst: LocalInstance) -> bool:
        assert self._http is not None, "use the backend as an async context manager"
        try:
            with anyio.fail_after(self._health.probe_timeout):
                async with self._http.get(f"http://127.0.0.1:{inst.health_port}/v1/health/ready") as resp:
                    return resp.status == 200
        except (TimeoutError, aiohttp.ClientError, OSError):
            return False

    async def _signal(self, proc: Proc, signum: int) -> None:
        """Signal a process of an instance (its whole group)."""
        if signum == signal.SIGKILL:
            processes.kill_group(proc.pid, signum)
        else:
            proc.signal_group(signum)

    async def _enforce_deadline(self, inst: LocalInstance, mono: float) -> None:
        """maxRuntimeDuration: SIGTERM when it passes, SIGKILL after the termination grace period."""
        proc = inst.procs.get(INFERENCE)
        if proc is None or inst.max_runtime is None or inst.task_started is None:
            return
        if inst.overtime_at is None and mono - inst.task_started > inst.max_runtime:
            inst.overtime_at = mono
            self._log.info(
                "task instance %s ran past its maxRuntimeDuration (%gs): stopping it, %gs grace",
                inst.instance_id,
                inst.max_runtime,
                inst.grace,
            )
            await self._signal(proc, signal.SIGTERM)
        elif inst.overtime_at is not None and mono - inst.overtime_at > inst.grace and proc.poll():
            await self._signal(proc, signal.SIGKILL)

    async def _task_ended(self, inst: LocalInstance, proc: Proc) -> None:
        """The task's process ended: its worker uploads what is left and stops; the instance is done."""
        worker = inst.procs.pop(WORKER, None)
        if worker is not None and worker.poll():
            worker.signal_group(signal.SIGTERM)
            with anyio.move_on_after(self._local.task_flush_timeout):
                await _until(lambda: not worker.poll(), 0.05)
            if worker.poll():
                processes.kill_group(worker.pid, signal.SIGKILL)
                with anyio.move_on_after(5):
                    await _until(lambda: not worker.poll(), 0.02)  # reaped, not left a zombie
        inst.due.clear()
        what = exit_text("the task", proc)
        overtime = inst.overtime_at is not None
        inst.completion = Completion(
            exit_code=proc.returncode if proc.returncode is not None else -1,
            detail=f"{what} after its maxRuntimeDuration" if overtime else what,
            cause=states.EXCEEDED_MAX_RUNTIME if overtime else None,
        )
        self._log.info("task instance %s: %s", inst.instance_id, inst.completion.detail)

    async def _probe(self, inst: LocalInstance) -> tuple[bool, str]:
        """The worker's readiness: the inference server is healthy and the worker is connected."""
        if WORKER not in inst.procs:
            return False, "the worker is not running"
        if INFERENCE not in inst.procs:
            return False, "the inference server is not running" + (
                " (waiting for the worker to fetch secrets)" if inst.secrets_wait is not None else ""
            )
        assert self._http is not None, "use the backend as an async context manager"
        url = f"http://127.0.0.1:{inst.health_port}/v1/health/ready"
        try:
            with anyio.fail_after(self._health.probe_timeout):
                async with self._http.get(url) as resp:
                    if resp.status == 200:
                        return True, ""
                    try:
                        body = await resp.json(content_type=None)
                    except ValueError:
                        body = {}
                    detail = body.get("detail") if isinstance(body, dict) else None
                    return False, f"not ready: {detail or f'HTTP {resp.status}'}"
        except TimeoutError:
            return False, f"the worker's readiness check took longer than {self._health.probe_timeout:g}s"
        except (aiohttp.ClientError, OSError):
            return False, "the worker's health endpoint does not answer yet"

    # ---- stopping ----------------------------------------------------------------------------------

    async def stop(self, handle: object, grace: float) -> None:
        inst = _local(handle)
        inst.stopped = True
        inst.due.clear()
        live = [p for p in inst.procs.values() if p.poll()]
        for proc in live:
            proc.signal_group(signal.SIGTERM)
        with anyio.move_on_after(grace):
            await _until(lambda: not any(p.poll() for p in live), 0.05)
        for proc in inst.procs.values():
            # The leader may be gone while what it started lives on in its group: that goes too.
            if proc.popen is not None or proc.poll():
                processes.kill_group(proc.pid, signal.SIGKILL)
        with anyio.move_on_after(5):
            await _until(lambda: not any(p.poll() for p in live), 0.02)
        inst.procs.clear()

    async def release(self, handle: object) -> None:
        inst = _local(handle)
        self._held.pop(inst.instance_id, None)
        if self._shipper is not None:
            self._shipper.forget(inst.instance_id)
        # Every child is reaped here, not left a zombie; one still running (stopped without a stop, or
        # slower than its SIGKILL) is killed with its group first and waited for a moment.
        running = [proc for proc in inst.spawned if proc.poll()]
        for proc in running:
            processes.kill_group(proc.pid, signal.SIGKILL)
        with anyio.move_on_after(RELEASE_WAIT):
            await _until(lambda: not any(p.poll() for p in running), 0.02)
        for proc in running:
            if proc.poll():
                self._log.warning(
                    "instance %s: pid %d outlived its SIGKILL; left to the system", inst.instance_id, proc.pid
                )
                proc.detach()  # no handle left on it: never a warning about it at collection
        inst.spawned.clear()
        for port in (inst.port, inst.health_port):
            if port is not None:
                self._ports.discard(port)
        if inst.fixed_port is not None and self._fixed.get(inst.fixed_port) == inst.instance_id:
            del self._fixed[inst.fixed_port]
        # Instance users: whatever still runs as them goes first, then the secrets, and the directory closes.
        slot, inst.slot = inst.slot, None
        await anyio.to_thread.run_sync(
            partial(self._users.close, inst.directory, slot, secrets=self._secrets_file(inst))
        )
        # Logs stay for `instance logs`; per-request files do not.
        for sub in ("assets", "responses"):
            await anyio.to_thread.run_sync(partial(shutil.rmtree, inst.directory / sub, ignore_errors=True))

    # ---- logs --------------------------------------------------------------------------------------

    async def discover(self, cluster_id: str) -> Inventory | None:
        return None  # the agent's own: nvidia-smi, or the configured inventory

    def cluster_facts(self, cluster_id: str) -> ClusterFacts:
        return ClusterFacts()

    async def logs(self, cluster_id: str, instance: AgentInstance, tail: int) -> tuple[AgentLog, ...]:
        if not instance.directory:
            return ()
        directory = Path(instance.directory)
        out = []
        for role in (INFERENCE, WORKER):
            path = directory / LOGS[role]
            try:
                size = path.stat().st_size
            except OSError:
                continue
            out.append(AgentLog(name=role, path=str(path), text=read_tail(path, tail), size=size))
        return tuple(out)

    def error_log(self, handle: object, source: str, limit: int) -> str:
        inst = _local(handle)
        role = WORKER if source in ("utils", "init") else INFERENCE
        return read_tail(inst.log_path(role), limit)

    async def sweep(self, cluster_id: str, root: Path, live: Sequence[AgentInstance]) -> list[str]:
        keep = {p.pid for i in live for p in i.processes}
        instances = root / "instances"
        owners = await anyio.to_thread.run_sync(self._users.owners, instances)
        found = await anyio.to_thread.run_sync(lambda: list(processes.cluster_processes(cluster_id, root, owners)))
        mine = os.getpgrp()
        # A recorded process keeps its whole group (a server's own workers); anything else goes.
        strays = {group: iid for pid, group, iid in found if pid not in keep and group not in keep and group != mine}
        for group, iid in strays.items():
            self._log.warning("stopping process group %d of instance %s: no request holds it", group, iid)
            processes.kill_group(group, signal.SIGTERM)
        if strays:
            with anyio.move_on_after(min(self._local.termination_grace, 5.0)):
                await _until(lambda: all(processes.start_ticks(group) is None for group in strays), 0.05)
            for group in strays:
                processes.kill_group(group, signal.SIGKILL)
        # Instances no record holds: whatever still runs as their users goes, and their directories close.
        closed = await anyio.to_thread.run_sync(
            self._users.close_strays, instances, frozenset(i.instance_id for i in live)
        )
        return sorted(set(strays.values()) | set(closed))


#: How often instance users' search permissions are checked (and given back where a chmod took them).
REACH_CHECK = 5.0
#: How long a released instance's children still running are waited for after their SIGKILL.
RELEASE_WAIT = 5.0


async def _until(done: Callable[[], bool], interval: float) -> None:
    """Poll until ``done()``: process exits of processes that are not our children signal nothing."""
    while not done():  # noqa: ASYNC110
        await anyio.sleep(interval)


def _local(handle: object) -> LocalInstance:
    assert isinstance(handle, LocalInstance), handle
    return handle


@final
class LocalProvider:
    """Contributes the ``local`` backend (to ``COMPUTE_BACKENDS``)."""

    name = "local"

    def create(self, ctx: BackendContext) -> LocalBackend:
        local = ctx.config.local
        if local.run_as == "instance-users" and os.geteuid() != 0:
            raise PluginConfigError(
                "plugins.compute.local.run_as is instance-users, which needs nvcf-mono to run as root (it starts "
                "instance processes as other users); run it as root, or set run_as: auto or platform-user"
            )
        return LocalBackend(
            catalog=ctx.catalog,
            environ=ctx.environ,
            health=ctx.config.health,
            local=local,
            log=ctx.log,
            endpoint=ctx.endpoint,
            state_dir=ctx.state_dir,
            telemetry_proxy=ctx.config.telemetry_proxy,
        )
