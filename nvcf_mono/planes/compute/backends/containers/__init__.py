"""The containers backend: an instance is its function's image, run by Podman or Docker, and a worker beside it.

The inference container is the image as built (its entrypoint, its env), with the deployment's
args and env, NVCF's mounts and its instance type's limits; it listens on its own ``inferencePort``
in a network namespace of its own, published on 127.0.0.1 only. The worker (``nvcf-mono worker``)
runs on the host as the local backend runs it, reaching the container through that port and sharing
the request directories through bind mounts; it is the platform's own code, so it runs as the
platform's user. The container sees nothing of the host but those mounts.

Everything else (restarts with backoff, crash loops, secrets before start, tasks run once with
their deadline, takeover after an agent restart) is the local backend's, with the container as
the instance's inference process.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import tempfile
import time
from collections.abc import Mapping, Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import final

import anyio
import attrs

from nvcf_mono.contracts import env, pull_credentials, states
from nvcf_mono.contracts.agent import AgentInstance, AgentLog, AgentProcess
from nvcf_mono.helm.images import ImageRef
from nvcf_mono.helm.model import RegistryCredential
from nvcf_mono.models.common import now_iso
from nvcf_mono.planes.compute import workload
from nvcf_mono.planes.compute.backends import BackendContext, LaunchSpec, WorkerEndpoint
from nvcf_mono.planes.compute.backends.containers import image_pull
from nvcf_mono.planes.compute.backends.containers.engine import (
    ContainerState,
    Engine,
    EngineError,
    NoEngine,
    gpu_devices,
    open_engine,
)
from nvcf_mono.planes.compute.backends.containers.image_access import ImageAccess
from nvcf_mono.planes.compute.backends.containers.spec import (
    ASSETS,
    MOUNTS,
    RESPONSES,
    SECRETS,
    TASK,
    container_name,
    create_body,
    host_directories,
)
from nvcf_mono.planes.compute.backends.kubernetes.manifests import CLUSTER_LABEL, INSTANCE_LABEL
from nvcf_mono.planes.compute.backends.local import INFERENCE, WORKER, LocalBackend, LocalInstance, _local
from nvcf_mono.planes.compute.backends.local.environment import Where, inference_environment, worker_environment
from nvcf_mono.planes.compute.backends.local.images import LaunchError
from nvcf_mono.planes.compute.backends.local.processes import Proc, open_log
from nvcf_mono.planes.compute.config import ContainerSettings, HealthSettings, LocalSettings
from nvcf_mono.planes.compute.log_stamps import Mark, new_lines
from nvcf_mono.plugin import PluginConfigError
from nvcf_mono.printable import one_line
from nvcf_mono.state_dir import write_private

_LOG_PUMP_INTERVAL = 1.0
#: The exit code a failed start counts as, when the container shows none of its own (a kubelet's StartError).
START_FAILED = 128
#: How long a failed start's container is watched for the run it may have had.
_SETTLE = 1.0


@attrs.define(eq=False)
class ContainerProc(Proc):
    """The inference container, standing where the local backend keeps a process (the engine signals it)."""

    container_id: str = ""
    running: bool = True
    engine: Engine | None = None

    def poll(self) -> bool:
        if self.ended:
            return False
        if self.running:
            return True
        self.ended = True
        return False

    def signal_group(self, signum: int) -> bool:
        return False  # through the engine: ContainersBackend._signal

    def is_same(self) -> bool:
        return self.running


@attrs.define(eq=False)
class ContainerInstance(LocalInstance):
    """A local instance whose inference process is a container."""

    cluster_id: str = ""
    image: str = ""
    body: dict[str, object] = attrs.field(factory=dict)
    container_id: str = ""
    #: The container's own ports and where they are published.
    ports: dict[int, int] = attrs.field(factory=dict)
    #: Where copying the container's log to inference.log got to, and when it was last done (monotonic).
    log_mark: Mark | None = None
    log_pumped: float = float("-inf")


class ContainersBackend(LocalBackend):
    """Runs instances as containers of their images on a Docker-compatible engine (Podman or Docker)."""

    name = "containers"

    def __init__(
        self,
        *,
        settings: Mapping[str, ContainerSettings],
        environ: Mapping[str, str],
        health: HealthSettings,
        local: LocalSettings,
        log: logging.Logger,
        endpoint: WorkerEndpoint | None = None,
        state_dir: Path | None = None,
        telemetry_proxy: str | None = None,
    ) -> None:
        # The worker is the platform's own code: it runs as the platform's user; the function is in its container.
        super().__init__(
            catalog={},
            environ=environ,
            health=health,
            local=attrs.evolve(local, run_as="platform-user"),
            log=log,
            endpoint=endpoint,
            state_dir=state_dir,
            telemetry_proxy=telemetry_proxy,
        )
        self._settings = dict(settings)  # cluster id -> settings
        self._environ = dict(environ)
        self._engines: dict[str, Engine] = {}
        self._stack = AsyncExitStack()
        #: An image's pull under way (the name it will have): later starts of it wait for it.
        self._pulling: dict[str, anyio.Lock] = {}
        self._access = ImageAccess(state_dir / "image-access.json" if state_dir is not None else None, log)

    def _announce(self) -> None:
        for cid, engine in self._engines.items():
            self._log.info(
                "cluster %s runs instances as containers on %s %s", cid, engine.kind, engine.version or "(version ?)"
            )

    async def __aenter__(self) -> ContainersBackend:
        await self._stack.__aenter__()
        try:
            for cid, settings in self._settings.items():
                own = Path(self._stack.enter_context(tempfile.TemporaryDirectory(prefix="nvcf-podman-")))
                try:
                    self._engines[cid] = await self._stack.enter_async_context(
                        open_engine(settings, self._environ, own / "api.sock")
                    )
                except NoEngine as err:
                    raise PluginConfigError(f"cluster {cid} (backend: containers): {err}") from err
            await super().__aenter__()
        except BaseException:
            await self._stack.aclose()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            await super().__aexit__(*exc)
        finally:
            self._engines.clear()
            with anyio.CancelScope(shield=True):
                await self._stack.aclose()

    def _engine(self, inst: LocalInstance) -> Engine:
        engine = self._engines.get(_container(inst).cluster_id)
        if engine is None:
            raise LaunchError(states.CREATE_CONTAINER_ERROR, "this cluster has no container engine")
        return engine

    # ---- starting ----------------------------------------------------------------------------------

    def _new_instance(self, spec: LaunchSpec, port: int | None, health_port: int | None) -> LocalInstance:
        return ContainerInstance(
            instance_id=spec.instance_id,
            directory=spec.directory,
            port=port,
            health_port=health_port,
            cluster_id=spec.cluster_id,
        )

    async def _open(self, spec: LaunchSpec, inst: LocalInstance) -> None:
        await super()._open(spec, inst)
        await self._pull(spec, _container(inst))

    async def _pull(self, spec: LaunchSpec, inst: ContainerInstance) -> None:
        """The image, pulled with the account's credentials for its registry unless present (pull_policy);
        ``inst.image`` is what the engine calls it then.
        """
        image = workload.image_of(spec.message).strip()
        if not image:
            raise LaunchError(states.CREATE_CONTAINER_ERROR, "the deployment names no container image")
        settings = self._settings[spec.cluster_id]
        engine = self._engine(inst)
        # The name it has once pulled (records of who may start it are under this one), then as given.
        names = [image]
        if settings.image_pulls == "platform":
            try:
                ref = image_pull.parse(image)
            except image_pull.ImagePullError as err:
                raise LaunchError(states.IMAGE_PULL_ISSUES, str(err)) from err
            names = list(dict.fromkeys([image_pull.local_name(ref), image]))
        key = names[0]
        account = spec.message.nca_id
        # One pull of an image at a time: instances starting together wait for the first's, then find it.
        lock = self._pulling.setdefault(key, anyio.Lock())
        waited = lock.locked()
        try:
            async with lock:
                found = await self._present(engine, names) if settings.pull_policy != "Always" or waited else None
                if found is None and settings.pull_policy == "Never":
                    raise LaunchError(
                        states.IMAGE_PULL_ISSUES, f"image {image!r} is not on this host and pull_policy is Never"
                    )
                raw = spec.message.launch_specification.environment.get(env.CONTAINER_REGISTRIES_CREDENTIALS, "")
                logins = pull_credentials.logins_for(raw, pull_credentials.image_registry(image))
                with anyio.fail_after(settings.pull_timeout):
                    if settings.image_pulls == "engine":
                        if found is None:
                            await self._engine_pull(engine, inst, image, logins, settings)
                    elif found is None:
                        found = key
                        read_by = await self._pull_here(spec, inst, ref, logins, settings)
                        self._access.pulled(key, account if read_by else None)
                    elif not self._access.allows(key, account):
                        # Pulled with another account's credentials: this one shows it can read the image.
                        read_by = await image_pull.readable(ref, _credentials(logins), self._pull_options(spec))
                        self._access.shown(key, account if read_by else None)
                inst.image = found or image
        except TimeoutError as err:
            raise LaunchError(
                states.IMAGE_PULL_ISSUES, f"pulling image {image!r} took longer than {settings.pull_timeout:g}s"
            ) from err
        except EngineError as err:
            raise LaunchError(states.IMAGE_PULL_ISSUES, f"cannot pull image {image!r}: {err.message}") from err
        except image_pull.ImagePullError as err:
            raise LaunchError(states.IMAGE_PULL_ISSUES, str(err)) from err
        finally:
            if not lock.statistics().tasks_waiting and not lock.locked():
                self._pulling.pop(key, None)

    @staticmethod
    async def _present(engine: Engine, names: Sequence[str]) -> str | None:
        """The first of ``names`` the engine has."""
        for name in names:
            if await engine.has_image(name):
                return name
        return None

    def _pull_options(self, spec: LaunchSpec) -> image_pull.PullOptions:
        settings = self._settings[spec.cluster_id]
        return image_pull.PullOptions(
            ca_file=settings.registry_ca_file,
            plain_http=settings.plain_http_registries,
            networks=settings.registry_networks,
            networks_setting=f"the cluster's containers.registry_networks (cluster {spec.cluster_id})",
            max_size=settings.max_image_size,
        )

    async def _pull_here(
        self,
        spec: LaunchSpec,
        inst: ContainerInstance,
        ref: ImageRef,
        logins: Sequence[tuple[str, str]],
        settings: ContainerSettings,
    ) -> RegistryCredential | None:
        """Read the image through the platform's checked client into the instance's directory, then load
        it; the credential that read it (None: anonymously).
        """
        self._log.info("instance %s: pulling %s%s", inst.instance_id, ref, " with credentials" if logins else "")
        engine = self._engine(inst)
        # A name of its own, made exclusively: nothing planted in the directory is written through.
        fd, scratch = tempfile.mkstemp(dir=spec.directory, prefix=".image-", suffix=".tar")
        os.close(fd)
        archive = Path(scratch)
        try:
            on_host = await self._layers_on_host(engine, spec.message.nca_id)
            pulled = await image_pull.pull_and_load(
                engine,
                ref,
                _credentials(logins),
                self._pull_options(spec),
                archive=archive,
                on_host=on_host,
                timeout=settings.pull_timeout,
                log=(self._log, f"instance {inst.instance_id}"),
            )
            return pulled.read_by
        finally:
            with anyio.CancelScope(shield=True):  # gigabytes, perhaps: off the event loop, even when cancelled
                await anyio.to_thread.run_sync(functools.partial(archive.unlink, missing_ok=True))

    async def _layers_on_host(self, engine: Engine, account: str) -> frozenset[str]:
        """The layers a pull for ``account`` need not read: those of the images it may start already. Podman
        loads an archive without them; Docker's load is not known to, and reads every layer.
        """
        if engine.kind != "podman":
            return frozenset()

        def allowed(names: Sequence[str]) -> bool:
            # By the names pulls record (Docker's short names are not), so a private image is never missed.
            return any(self._access.allows(_canonical(name), account) for name in names)

        try:
            return frozenset(await engine.layers_of(allowed))
        except EngineError as err:
            self._log.warning("cannot list the images on this host (%s): the pull reads every layer", err.message)
            return frozenset()

    async def _engine_pull(
        self,
        engine: Engine,
        inst: ContainerInstance,
        image: str,
        logins: Sequence[tuple[str, str]],
        settings: ContainerSettings,
    ) -> None:
        """The engine pulls the image itself (image_pulls: engine), with the first login for its registry."""
        host = pull_credentials.image_registry(image)
        auth = {"username": logins[0][0], "password": logins[0][1], "serveraddress": host} if logins else None
        self._log.info("instance %s: pulling %s%s", inst.instance_id, image, " with credentials" if auth else "")
        await engine.pull(image, auth, settings.pull_timeout)

    def _prepare(self, spec: LaunchSpec, inst: LocalInstance) -> None:
        """The worker's command and environment, and the container's create body (raises LaunchError)."""
        ci = _container(inst)
        message = spec.message
        contract = message.launch_specification.environment
        task = message.task_details is not None
        declared = _port(contract.get(env.INFERENCE_PORT), 8000)
        health = _port(contract.get(env.INFERENCE_HEALTH_PORT), declared)
        assert inst.port is not None and inst.health_port is not None
        if not ci.ports:
            ci.ports = {declared: inst.port}
            if health != declared:
                ci.ports[health] = self._port()
        devices = spec.allocation.devices if spec.allocation is not None else ()
        where = Where(
            instance_id=inst.instance_id,
            cluster_id=spec.cluster_id,
            port=declared,
            health_port=inst.health_port,
            directory=spec.directory,
            devices=devices,
            ready_timeout=self._health.start_timeout + 60,
            health_interval=min(self._health.probe_interval, 1.0),
            secrets_refresh=self._local.secrets_refresh,
            telemetry_proxy=self._telemetry_proxy,
        )
        settings = self._settings[spec.cluster_id]
        gpus = gpu_devices(settings.gpus, devices)
        engine = self._engine(inst)
        # The container: its image's env, then the deployment's, then NVCF's (paths as it sees them).
        inner = inference_environment({}, contract, {}, where)
        inner[env.SECRETS_FILE] = f"{MOUNTS[SECRETS]}/secrets.json"
        if gpus:
            inner.pop(env.CUDA_VISIBLE_DEVICES, None)  # CDI gives it its GPUs, numbered from 0
        worker = worker_environment(self._base, contract, attrs.evolve(where, port=inst.port))
        worker.update(
            {
                env.INFERENCE_HEALTH_PORT: str(ci.ports[health]),
                env.SECRETS_FILE: str(self._secrets_file(inst)),
                env.INFERENCE_ASSET_DIR: MOUNTS[ASSETS],
                env.INFERENCE_RESPONSE_DIR: MOUNTS[RESPONSES],
            }
        )
        inst.envs = {INFERENCE: inner, WORKER: worker}
        if task:
            self._task_contract(spec, inst, inner, worker)
        ci.body = create_body(
            spec,
            image=ci.image,
            args=workload.container_args(contract.get(env.INFERENCE_CONTAINER_ARGS, "")),
            environment=inner,
            ports=ci.ports,
            settings=settings,
            gpus=gpus,
            kind=engine.kind,
        )
        inst.argv = {INFERENCE: (ci.image,), WORKER: tuple(self._worker_argv)}
        inst.cwd = {WORKER: spec.directory}
        try:
            for path in host_directories(spec.directory, task):
                path.mkdir(exist_ok=True)
                # The container's user may be anyone its image says: these are the pod's emptyDirs.
                path.chmod(0o755 if path.name == SECRETS else 0o777)
        except OSError as err:
            raise LaunchError(
                states.CREATE_CONTAINER_ERROR, f"cannot prepare the instance's directories: {err}"
            ) from err
        self._write_address(inst, self._endpoint.address or contract.get(env.NVCF_FQDN_GRPC, ""))

    def _task_contract(
        self, spec: LaunchSpec, inst: LocalInstance, inner: dict[str, str], worker: dict[str, str]
    ) -> None:
        """A task: run once with its deadline; results and progress where NVCT puts them, as each side sees them."""
        self._as_task(inst, spec)  # run once, deadline and grace, the task's ids (and local paths, replaced here)
        inner[env.NVCT_PROGRESS_FILE_PATH] = f"{MOUNTS[TASK]}/progress"
        inner[env.NVCT_RESULTS_DIR] = f"{MOUNTS[TASK]}/results"
        worker[env.NVCT_PROGRESS_FILE_PATH] = str(spec.directory / TASK / "progress")
        worker[env.NVCT_RESULTS_DIR] = str(spec.directory / TASK / "results")

    def _umask(self, role: str) -> int | None:
        # What the worker makes for a request (asset files, output directories) is the container's to read
        # and write whatever user its image runs as, as in a pod's emptyDir; the instance directory around
        # them stays closed to everyone else on the host.
        return 0 if role == WORKER else None

    def _secrets_file(self, inst: LocalInstance) -> Path:
        return inst.directory / SECRETS / "secrets.json"

    async def _spawn(self, inst: LocalInstance, role: str, *, again: bool = False) -> None:
        if role != INFERENCE:
            await super()._spawn(inst, role, again=again)
            return
        ci = _container(inst)
        engine = self._engine(inst)
        secrets = self._secrets_file(inst)
        try:
            if not secrets.exists():
                secrets.write_text("{}")  # NVCF mounts the file whether or not there are secrets
            secrets.parent.chmod(0o755)
            secrets.chmod(0o644)  # read-only in the container, for whichever user its image runs as
        except OSError as err:
            raise LaunchError(states.CREATE_CONTAINER_ERROR, f"cannot prepare the secrets mount: {err}") from err
        try:
            if not ci.container_id:
                ci.container_id = await self._create(engine, ci)
            else:
                await self._pump_log(ci, now=True)  # what its last run wrote goes before the banner
            said = f"{inst.starting(role, again)}: container {ci.container_id[:12]} of {ci.image}"
            self._log.info("instance %s: %s", inst.instance_id, said)
            await self._say(inst, said)
            state, refused = await self._start(inst, engine, ci.container_id)
        except EngineError as err:
            raise LaunchError(states.CREATE_CONTAINER_ERROR, f"cannot start the inference container: {err}") from err
        proc = ContainerProc(
            role=INFERENCE,
            pid=state.pid if state is not None else 0,
            ticks=0,
            started_at=now_iso(),
            container_id=ci.container_id,
            running=state is not None and (state.running or state.exit_code is None),
            engine=engine,
            ended_how=refused,
        )
        if state is not None and not state.running:
            proc.returncode = state.exit_code
        inst.procs[INFERENCE] = proc
        if inst.run_once and inst.task_started is None:
            inst.task_started = time.monotonic()

    async def _say(self, inst: LocalInstance, said: str) -> None:
        """A line of the platform's own in the instance's inference log, between its runs' output."""
        try:
            line = f"--- {now_iso()} nvcf-mono: {said}\n"
            await anyio.to_thread.run_sync(_append_log, inst.log_path(INFERENCE), line, None)
        except OSError as err:
            self._log.warning("instance %s: cannot write its log: %s", inst.instance_id, err)

    async def _start(self, inst: LocalInstance, engine: Engine, cid: str) -> tuple[ContainerState | None, str]:
        """Start the container; its state after, and what the engine said if it refused a restart (raises
        EngineError).

        An engine may fail a start that did run the container: Podman 4.3 does when the process ends
        before Podman has read its cgroup. So a failed start is a run that ended when the container
        shows a run since, or when it has run before (a restart, which the restart loop then counts, as
        a kubelet counts a StartError); only a first start that shows nothing is the instance's
        ``create-container-error``.
        """
        before = await engine.state(cid)
        try:
            await engine.start(cid)
        except EngineError as err:
            after = await engine.state(cid)
            with anyio.move_on_after(_SETTLE):  # the engine may record a run that ended only a moment later
                while before is not None and after is not None and not after.ran_since(before):
                    await anyio.sleep(_SETTLE / 10)
                    after = await engine.state(cid)
            if before is None or after is None:
                raise
            ran = after.ran_since(before)
            if not (ran or before.started_at):
                raise
            self._log.warning("instance %s: its container's start failed: %s", inst.instance_id, err)
            await self._say(inst, f"the container engine says its start failed: {one_line(err.message)}")
            if ran:
                return after, ""
            refused = f"could not be started again: {one_line(err.message)[:300]}"
            return attrs.evolve(after, running=False, exit_code=START_FAILED), refused
        return await engine.state(cid), ""

    async def _create(self, engine: Engine, inst: ContainerInstance) -> str:
        name = container_name(inst.instance_id)
        try:
            return await engine.create(name, inst.body)
        except EngineError as err:
            if err.status != 409 and "already in use" not in err.message:  # Docker says 409, Podman 500
                raise
        await engine.remove(name)  # left from an earlier start of this instance that no record holds
        return await engine.create(name, inst.body)

    async def _take_over(self, inst: LocalInstance, rec: AgentProcess) -> Proc | None:
        if rec.role != INFERENCE:
            return await super()._take_over(inst, rec)
        ci = _container(inst)
        try:
            state = await self._engine(inst).state(container_name(inst.instance_id))
        except EngineError:
            return None
        if state is None or state.labels.get(INSTANCE_LABEL) != inst.instance_id:
            return None
        ci.container_id = state.id  # started again if it exited meanwhile
        # Where the agent before this one got to in copying its log.
        ci.log_mark = await anyio.to_thread.run_sync(_read_mark, inst.log_path(INFERENCE))
        if not state.running:
            return None
        return ContainerProc(
            role=INFERENCE,
            pid=state.pid,
            ticks=0,
            started_at=rec.started_at,
            container_id=state.id,
            running=True,
            engine=self._engine(inst),
        )

    # ---- watching ----------------------------------------------------------------------------------

    async def _tend(self, inst: LocalInstance) -> None:
        await self._refresh(inst)
        await super()._tend(inst)

    async def _refresh(self, inst: LocalInstance) -> None:
        """The container's state, for the local backend's bookkeeping of exits, and its new output."""
        proc = inst.procs.get(INFERENCE)
        if not isinstance(proc, ContainerProc) or not proc.running:
            return
        try:
            state = await self._engine(inst).state(proc.container_id)
        except EngineError as err:
            self._log.warning("instance %s: cannot inspect its container: %s", inst.instance_id, err)
            return
        if state is not None and state.running:
            await self._pump_log(_container(inst))
            return
        proc.running = False
        if state is None:  # removed behind the agent's back: the next start makes it anew
            proc.returncode = None
            _container(inst).container_id = ""
            return
        proc.returncode = -signal.SIGKILL if state.oom_killed else state.exit_code
        await self._pump_log(_container(inst), now=True)

    async def _pump_log(self, inst: ContainerInstance, *, now: bool = False) -> None:
        """Append what the container wrote since the last look to the instance's ``inference.log``, so its
        log is a file like a local instance's (``instance logs``, ``--follow``, failure reports, kept after
        the container is removed). At most once a second unless ``now``.
        """
        mono = anyio.current_time()
        if not inst.container_id or (not now and mono - inst.log_pumped < _LOG_PUMP_INTERVAL):
            return
        inst.log_pumped = mono
        try:
            raw = await self._engine(inst).logs_since(inst.container_id, inst.log_mark[0] if inst.log_mark else None)
        except (EngineError, LaunchError) as err:
            self._log.debug("instance %s: cannot read its container's log: %s", inst.instance_id, err)
            return
        fresh, inst.log_mark = new_lines(raw, inst.log_mark)
        if fresh:
            try:
                await anyio.to_thread.run_sync(_append_log, inst.log_path(INFERENCE), fresh, inst.log_mark)
            except OSError as err:
                self._log.warning("instance %s: cannot keep its container's log: %s", inst.instance_id, err)

    async def _signal(self, proc: Proc, signum: int) -> None:
        if not isinstance(proc, ContainerProc):
            await super()._signal(proc, signum)
            return
        if proc.engine is not None:
            try:
                await proc.engine.kill(proc.container_id, signal.Signals(signum).name)
            except EngineError as err:
                self._log.warning("cannot signal container %s: %s", proc.container_id[:12], err)

    # ---- stopping ----------------------------------------------------------------------------------

    async def stop(self, handle: object, grace: float) -> None:
        inst = _local(handle)
        proc = inst.procs.pop(INFERENCE, None)
        async with anyio.create_task_group() as tg:
            if isinstance(proc, ContainerProc):
                tg.start_soon(self._stop_container, inst, proc, grace)
            tg.start_soon(super().stop, inst, grace)

    async def _stop_container(self, inst: LocalInstance, proc: ContainerProc, grace: float) -> None:
        try:
            await self._engine(inst).stop(proc.container_id, grace)
        except (EngineError, LaunchError) as err:
            self._log.warning("instance %s: cannot stop its container: %s", inst.instance_id, err)
        proc.running = False

    async def release(self, handle: object) -> None:
        inst = _container(_local(handle))
        if inst.container_id and inst.cluster_id in self._engines:
            with anyio.CancelScope(shield=True):
                await self._pump_log(inst, now=True)
                try:
                    await self._engine(inst).remove(inst.container_id)
                except EngineError as err:
                    self._log.warning("instance %s: cannot remove its container: %s", inst.instance_id, err)
        for port in inst.ports.values():
            self._ports.discard(port)
        await super().release(inst)

    async def sweep(self, cluster_id: str, root: Path, live: Sequence[AgentInstance]) -> list[str]:
        stopped = await super().sweep(cluster_id, root, live)
        engine = self._engines.get(cluster_id)
        if engine is None:
            return stopped
        keep = {i.instance_id for i in live}
        try:
            found = await engine.find({CLUSTER_LABEL: cluster_id})
        except EngineError as err:
            self._log.warning("cannot list cluster %s's containers: %s", cluster_id, err)
            return stopped
        for state in found:
            iid = state.labels.get(INSTANCE_LABEL, "")
            if iid in keep:
                continue
            self._log.warning("removing container %s of instance %s: no request holds it", state.id[:12], iid)
            try:
                await engine.remove(state.id)
            except EngineError as err:
                self._log.warning("cannot remove container %s: %s", state.id[:12], err)
                continue
            stopped.append(iid)
        return sorted(set(stopped))

    # ---- logs --------------------------------------------------------------------------------------

    async def logs(self, cluster_id: str, instance: AgentInstance, tail: int) -> tuple[AgentLog, ...]:
        held = self._held.get(instance.instance_id)
        if isinstance(held, ContainerInstance) and held.cluster_id in self._engines:
            await self._pump_log(held, now=True)  # up to this moment
        return await super().logs(cluster_id, instance, tail)


def _mark_file(log: Path) -> Path:
    return log.with_name(log.name + ".mark")


def _read_mark(log: Path) -> Mark | None:
    """Where an earlier agent stopped copying the container's log (None: from its start)."""
    try:
        seconds, nanos, count = _mark_file(log).read_text().split()
        return int(seconds), int(nanos), int(count)
    except (OSError, ValueError):
        return None


def _append_log(log: Path, text: str, mark: Mark | None) -> None:
    with open_log(log) as out:
        out.write(text.encode())
    if mark is not None:
        write_private(_mark_file(log), " ".join(map(str, mark)).encode())


def _credentials(logins: Sequence[tuple[str, str]]) -> list[RegistryCredential]:
    return [RegistryCredential(username=user, password=password) for user, password in logins]


def _canonical(name: str) -> str:
    """The name a pull records for the image the engine calls ``name``."""
    try:
        return image_pull.local_name(image_pull.parse(name))
    except image_pull.ImagePullError:
        return name


def _container(inst: LocalInstance) -> ContainerInstance:
    assert isinstance(inst, ContainerInstance), inst
    return inst


def _port(text: str | None, default: int) -> int:
    try:
        port = int(text) if text else default
    except ValueError:
        return default
    return port if 0 < port < 65536 else default


@final
class ContainersProvider:
    """Contributes the ``containers`` backend (to ``COMPUTE_BACKENDS``)."""

    name = "containers"

    def create(self, ctx: BackendContext) -> ContainersBackend:
        settings = {ctx.cluster_ids[c.name]: c.containers for c in ctx.config.clusters if c.backend == self.name}
        return ContainersBackend(
            settings=settings,
            environ=ctx.environ,
            health=ctx.config.health,
            local=ctx.config.local,
            log=ctx.log,
            endpoint=ctx.endpoint,
            state_dir=ctx.state_dir,
            telemetry_proxy=ctx.config.telemetry_proxy,
        )
