"""What the engine is asked to create for an instance's inference container (Docker's create body).

The container gets its image's own entrypoint and environment, the deployment's args and env, the
NVCF mounts (``/var/inf`` for assets and responses, ``/var/secrets`` read-only, ``/var/task`` for
a task), its instance type's CPU, memory and ``/dev/shm``, its GPUs, and labels naming whose it is.
Its inference port is published on 127.0.0.1 only, where the worker beside it reaches it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from nvcf_mono.planes.compute.backends import LaunchSpec
from nvcf_mono.planes.compute.backends.kubernetes.manifests import DATA_DIR, SECRETS_DIR, TASK_DIR, instance_labels
from nvcf_mono.planes.compute.config import ContainerSettings

#: The instance's host directories and where the container sees them.
ASSETS, RESPONSES, SECRETS, TASK = "assets", "responses", "secrets", "task"
MOUNTS = {
    ASSETS: f"{DATA_DIR}/assets",
    RESPONSES: f"{DATA_DIR}/responses",
    SECRETS: SECRETS_DIR,
    TASK: TASK_DIR,
}


def container_name(instance_id: str) -> str:
    return f"nvcf-{instance_id}"


def memory_bytes(text: str | None) -> int | None:
    """``3G`` -> bytes (the instance type's systemMemory); None when unknown."""
    if not text:
        return None
    units = {"K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}
    number, unit = text[:-1], text[-1:].upper()
    try:
        return int(float(number) * units[unit]) if unit in units else int(text)
    except ValueError:
        return None


def create_body(
    spec: LaunchSpec,
    *,
    image: str,
    args: Sequence[str],
    environment: Mapping[str, str],
    ports: Mapping[int, int],
    settings: ContainerSettings,
    gpus: Sequence[str],
    kind: str,
) -> dict[str, Any]:
    """The body of ``POST /containers/create`` for the instance's inference container; ``ports``: each of
    its own ports and where it is published on 127.0.0.1.
    """
    mounted = _mounted(spec.message.task_details is not None)
    binds = [f"{spec.directory / name}:{MOUNTS[name]}:{'ro' if name == SECRETS else 'rw'}" for name in mounted]
    host: dict[str, Any] = {
        "Binds": binds,
        "PortBindings": {f"{port}/tcp": [{"HostIp": "127.0.0.1", "HostPort": str(out)}] for port, out in ports.items()},
        "RestartPolicy": {"Name": "no"},  # the agent restarts it, counting exits (a crash loop is a state)
        "ShmSize": settings.shm_size,
        "SecurityOpt": ["no-new-privileges"],
    }
    if settings.network:
        host["NetworkMode"] = settings.network
    if settings.limit_resources:
        if spec.cpus:
            host["NanoCpus"] = int(spec.cpus * 1e9)
        memory = memory_bytes(spec.memory)
        if memory:
            host["Memory"] = memory
    if gpus:
        if kind == "podman":
            host["Devices"] = [{"PathOnHost": g, "PathInContainer": "", "CgroupPermissions": ""} for g in gpus]
        else:
            host["DeviceRequests"] = [{"Driver": "cdi", "DeviceIDs": list(gpus)}]
    body: dict[str, Any] = {
        "Image": image,
        "Env": [f"{k}={v}" for k, v in sorted(environment.items())],
        "Labels": instance_labels(spec),
        "ExposedPorts": {f"{port}/tcp": {} for port in ports},
        "HostConfig": host,
    }
    if args:
        body["Cmd"] = list(args)  # like a pod's args: the image's entrypoint stays
    return body


def host_directories(directory: Path, task: bool) -> list[Path]:
    """The instance's directories the container mounts (created before it is)."""
    made = [directory / name for name in _mounted(task)]
    return made + ([directory / TASK / "results"] if task else [])


def _mounted(task: bool) -> list[str]:
    """The instance directories the container mounts (``MOUNTS`` says where)."""
    return [ASSETS, RESPONSES, SECRETS, *([TASK] if task else [])]
