"""A container engine's API: Docker's, which Podman serves too (``podman system service``), through aiodocker.

Only what the backend needs: pull (with the account's credentials) or load an image, create, start, inspect, signal,
stop, remove, logs, and list by label. Every call has a deadline; errors come out as
:class:`EngineError` with the engine's own message.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any, Literal

import aiodocker
import aiohttp
import anyio
import attrs

from nvcf_mono.backoff import Backoff
from nvcf_mono.planes.compute.config import ContainerSettings

Kind = Literal["podman", "docker"]
#: Images looked at for the layers a pull may reuse (on a host with more, the rest are not).
IMAGES_READ = 1_000
_LIST_TRIES = 3


class EngineError(Exception):
    """A call to the engine failed (``status``: its HTTP status, 0 when it never answered)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class NoEngine(Exception):
    """No engine answers where the settings say, or anywhere this backend looks."""


@attrs.frozen
class ContainerState:
    """What the engine says of a container now."""

    id: str
    running: bool
    exit_code: int | None
    pid: int
    oom_killed: bool = False
    labels: Mapping[str, str] = attrs.field(factory=dict)
    #: The engine's word for it ("created", "running", "exited", ...), and when its last run started and
    #: ended ("" for never).
    status: str = ""
    started_at: str = ""
    finished_at: str = ""

    def ran_since(self, before: ContainerState) -> bool:
        """Whether it has run since ``before`` was its state: it runs, or it has exited since (a failed
        start may leave it "created" with its times reset, which is no run).
        """
        since = (self.started_at, self.finished_at) != (before.started_at, before.finished_at)
        return self.running or (self.status == "exited" and since)


async def _progress(stream: AsyncIterator[Any]) -> None:
    """Read a pull's or a load's progress to its end; an error it reports is EngineError."""
    try:
        async for item in stream:
            if isinstance(item, dict) and item.get("error"):
                raise EngineError(500, str(item.get("error")))
    except aiodocker.DockerError as err:
        raise EngineError(err.status, err.message) from err
    except (aiohttp.ClientError, OSError) as err:
        raise EngineError(0, f"the engine does not answer: {err or type(err).__name__}") from err


def _timestamp(value: object) -> str:
    # Both engines write Go's zero time for a container that never started or never ended.
    text = str(value or "")
    return "" if text.startswith("0001-01-01") else text


class Engine:
    """One engine connection (one per cluster)."""

    def __init__(self, docker: aiodocker.Docker, kind: Kind, version: str, *, api_timeout: float) -> None:
        self.docker = docker
        self.kind: Kind = kind
        self.version = version
        self._timeout = api_timeout
        #: Image id -> its layers: an id is its config's digest, so its layers never change.
        self._layers: dict[str, tuple[str, ...]] = {}

    # ---- images --------------------------------------------------------------------------------

    async def has_image(self, image: str) -> bool:
        try:
            with anyio.fail_after(self._timeout):
                await self.docker.images.inspect(image)
        except aiodocker.DockerError as err:
            if err.status == 404:
                return False
            raise EngineError(err.status, err.message) from err
        except (aiohttp.ClientError, OSError, TimeoutError) as err:
            raise EngineError(0, f"the engine does not answer: {err or type(err).__name__}") from err
        return True

    async def layers_of(self, wanted: Callable[[Sequence[str]], bool]) -> set[str]:
        """The layers (diff IDs) of the tagged images whose names ``wanted`` takes, of the first
        :data:`IMAGES_READ` the engine lists.
        """
        backoff = Backoff(0.2, 1.0)
        for attempt in range(_LIST_TRIES):
            try:
                images = (await self._call(self.docker.images.list()))[:IMAGES_READ]
                break
            except EngineError as err:
                # Podman 4.3 fails the whole list when an image it found is gone as it reads it (one being
                # removed or replaced meanwhile): the next list does not have it.
                if err.status < 500 or attempt + 1 == _LIST_TRIES:
                    raise
                await anyio.sleep(backoff.next())
        found: set[str] = set()
        for image in images:
            names = [str(tag) for tag in image.get("RepoTags") or () if tag and tag != "<none>:<none>"]
            image_id = str(image.get("Id"))
            if not names or not wanted(names):
                continue
            layers = self._layers.get(image_id)
            if layers is None:
                try:
                    data = await self._call(self.docker.images.inspect(image_id))
                except EngineError as err:
                    if err.status == 404:  # removed since it was listed
                        continue
                    raise
                layers = tuple(str(layer) for layer in (data.get("RootFS") or {}).get("Layers") or ())
                self._layers[image_id] = layers
            found.update(layers)
        listed = {str(image.get("Id")) for image in images}
        self._layers = {k: v for k, v in self._layers.items() if k in listed}  # as many as images on the host
        return found

    async def pull(self, image: str, auth: Mapping[str, str] | None, timeout: float) -> None:
        """Pull ``image`` (raises EngineError; TimeoutError after ``timeout``)."""
        with anyio.fail_after(timeout):
            await _progress(self.docker.images.pull(image, auth=dict(auth) if auth else None, stream=True))

    async def load(self, archive: Path, timeout: float) -> None:
        """Load the images of a ``docker save`` archive (raises EngineError; TimeoutError after ``timeout``)."""
        with anyio.fail_after(timeout), archive.open("rb") as data:
            await _progress(self.docker.images.import_image(data, stream=True))

    # ---- containers ----------------------------------------------------------------------------

    async def create(self, name: str, config: Mapping[str, Any]) -> str:
        container = await self._call(self.docker.containers.create(dict(config), name=name))
        return str(container.id)

    async def start(self, cid: str) -> None:
        await self._call(self.docker.containers.container(cid).start())

    async def state(self, cid: str) -> ContainerState | None:
        """The container's state; None when it is gone."""
        try:
            data = await self._call(self.docker.containers.container(cid).show())
        except EngineError as err:
            if err.status == 404:
                return None
            raise
        st = data.get("State") or {}
        running = bool(st.get("Running")) or st.get("Status") in ("running", "paused")
        return ContainerState(
            id=str(data.get("Id", cid)),
            running=running,
            exit_code=None if running else int(st.get("ExitCode") or 0),
            pid=int(st.get("Pid") or 0),
            oom_killed=bool(st.get("OOMKilled")),
            labels=dict((data.get("Config") or {}).get("Labels") or {}),
            status=str(st.get("Status") or ""),
            started_at=_timestamp(st.get("StartedAt")),
            finished_at=_timestamp(st.get("FinishedAt")),
        )

    async def kill(self, cid: str, signal: str) -> None:
        try:
            await self._call(self.docker.containers.container(cid).kill(signal=signal))
        except EngineError as err:
            if err.status not in (404, 409, 500):  # gone, or not running (Podman says 500 for that)
                raise

    async def stop(self, cid: str, grace: float) -> None:
        """SIGTERM (or the image's STOPSIGNAL), then SIGKILL after ``grace`` seconds."""
        container = self.docker.containers.container(cid)
        try:
            with anyio.fail_after(grace + self._timeout):
                await container.stop(t=max(int(grace + 0.999), 0))
        except aiodocker.DockerError as err:
            if err.status not in (304, 404):  # already stopped, or gone
                raise EngineError(err.status, err.message) from err
        except (aiohttp.ClientError, OSError, TimeoutError) as err:
            raise EngineError(0, f"the engine does not answer: {err or type(err).__name__}") from err

    async def remove(self, cid: str) -> None:
        try:
            await self._call(self.docker.containers.container(cid).delete(force=True))
        except EngineError as err:
            if err.status not in (404, 409):  # gone, or already being removed
                raise

    async def logs_since(self, cid: str, since: int | None) -> str:
        """Its output (stdout and stderr, as written) from ``since`` (Unix seconds; None: all), each line
        prefixed with the engine's RFC 3339 timestamp and a space.
        """
        params: dict[str, Any] = {"timestamps": True}
        if since is not None:
            params["since"] = since
        try:
            pieces = await self._call(self.docker.containers.container(cid).log(stdout=True, stderr=True, **params))
        except EngineError as err:
            if err.status == 404:
                return ""
            raise
        return "".join(pieces)

    async def find(self, labels: Mapping[str, str]) -> list[ContainerState]:
        """Every container (running or not) carrying all ``labels``."""
        wanted = [f"{k}={v}" for k, v in labels.items()]
        found = await self._call(self.docker.containers.list(all="true", filters=json.dumps({"label": wanted})))
        out = []
        for container in found:
            state = await self.state(str(container.id))
            if state is not None:
                out.append(state)
        return out

    async def _call(self, awaitable: Any) -> Any:
        try:
            with anyio.fail_after(self._timeout):
                return await awaitable
        except aiodocker.DockerError as err:
            raise EngineError(err.status, err.message) from err
        except (aiohttp.ClientError, OSError) as err:
            raise EngineError(0, f"the engine does not answer: {err or type(err).__name__}") from err
        except TimeoutError as err:
            raise EngineError(0, f"the engine did not answer within {self._timeout:g}s") from err


def socket_candidates(settings: ContainerSettings, environ: Mapping[str, str]) -> list[str]:
    """Where to look for the engine's socket, in order (unix:// URLs)."""
    if settings.socket:
        return [settings.socket if "://" in settings.socket else f"unix://{settings.socket}"]
    found = []
    host = environ.get("DOCKER_HOST", "")
    if host.startswith("unix://"):
        found.append(host)
    podman = ["/run/podman/podman.sock"]
    docker = ["/var/run/docker.sock"]
    runtime = environ.get("XDG_RUNTIME_DIR")
    if runtime:
        podman.append(f"{runtime}/podman/podman.sock")
    order = docker + podman if settings.engine == "docker" else podman + docker
    found.extend(f"unix://{p}" for p in order if Path(p).is_socket())
    return found


async def _connect(url: str, settings: ContainerSettings) -> Engine:
    docker = aiodocker.Docker(url=url)
    try:
        with anyio.fail_after(settings.api_timeout):
            version = await docker.version()
    except (aiodocker.DockerError, aiohttp.ClientError, OSError, TimeoutError) as err:
        await docker.close()
        raise NoEngine(f"{url}: {err or type(err).__name__}") from err
    names = " ".join(str(c.get("Name", "")) for c in version.get("Components") or [])
    kind: Kind = "podman" if "podman" in names.lower() else "docker"
    if settings.engine not in ("auto", kind):
        await docker.close()
        raise NoEngine(f"{url} is {kind}, not {settings.engine} (plugins.compute.clusters[].containers.engine)")
    return Engine(docker, kind, str(version.get("Version", "")), api_timeout=settings.api_timeout)


@asynccontextmanager
async def open_engine(
    settings: ContainerSettings, environ: Mapping[str, str], own_socket: Path
) -> AsyncIterator[Engine]:
    """Connect to the configured or first answering engine; else run ``podman system service`` at
    ``own_socket`` while the engine is in use (raises NoEngine saying where it looked).
    """
    tried: list[str] = []
    for url in socket_candidates(settings, environ):
        try:
            engine = await _connect(url, settings)
        except NoEngine as err:
            tried.append(str(err))
            continue
        try:
            yield engine
        finally:
            with anyio.move_on_after(5, shield=True):
                await engine.docker.close()
        return
    podman = shutil.which("podman", path=environ.get("PATH"))
    if settings.socket or not settings.start_podman or settings.engine == "docker" or podman is None:
        where = "; ".join(tried) or "no engine socket found"
        raise NoEngine(
            f"no container engine answers ({where}); start one (e.g. `podman system service`) or set "
            "plugins.compute.clusters[].containers.socket"
        )
    async with _podman_service(podman, own_socket, environ) as url:
        engine = await _wait_engine(url, settings)
        try:
            yield engine
        finally:
            with anyio.move_on_after(5, shield=True):
                await engine.docker.close()


@asynccontextmanager
async def _podman_service(podman: str, sock: Path, environ: Mapping[str, str]) -> AsyncIterator[str]:
    """``podman system service --time=0`` on ``sock``, stopped when the block ends."""
    url = f"unix://{sock}"
    proc = await anyio.to_thread.run_sync(_start_podman, podman, sock, url, environ)
    try:
        yield url
    finally:
        proc.terminate()
        with anyio.move_on_after(5, shield=True):
            while proc.poll() is None:  # noqa: ASYNC110 - a child without an async wait
                await anyio.sleep(0.05)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _start_podman(podman: str, sock: Path, url: str, environ: Mapping[str, str]) -> subprocess.Popen[bytes]:
    sock.parent.mkdir(parents=True, exist_ok=True)
    with suppress(FileNotFoundError):
        sock.unlink()
    with open(sock.with_suffix(".log"), "ab") as out:
        return subprocess.Popen(
            [podman, "system", "service", "--time=0", url],
            env=dict(environ),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


async def _wait_engine(url: str, settings: ContainerSettings) -> Engine:
    deadline = anyio.current_time() + max(settings.api_timeout, 10.0)
    while True:
        try:
            return await _connect(url, settings)
        except NoEngine:
            if anyio.current_time() > deadline:
                raise
            await anyio.sleep(0.1)


def gpu_devices(setting: str, devices: Sequence[int]) -> list[str]:
    """CDI names of an instance's GPUs (``nvidia.com/gpu=<index>``), where containers get real ones."""
    if setting == "none" or not devices:
        return []
    specs = (name for d in ("/etc/cdi", "/var/run/cdi") if Path(d).is_dir() for name in os.listdir(d))
    if setting == "auto" and not any("nvidia" in name for name in specs):
        return []
    return [f"nvidia.com/gpu={i}" for i in devices]
