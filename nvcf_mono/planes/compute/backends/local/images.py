"""The image catalog of the local backend: a container image reference -> a command line on this machine.

``containerImage`` is looked up as given, then without its registry host, then by its last path
component with and without the tag (``nvcr.io/acme/echo:1.2`` -> ``acme/echo:1.2`` -> ``echo:1.2`` ->
``echo``). Placeholders ``{port}``, ``{python}`` and ``{instance_dir}`` are replaced in the image's
command, working directory and environment (the operator's), never in the tenant's ``containerArgs``,
which follow the command as written (``contracts/tenant_env.py``).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path

import attrs

from nvcf_mono.contracts import states
from nvcf_mono.planes.compute import workload
from nvcf_mono.planes.compute.config import Image
from nvcf_mono.planes.compute.health import LaunchFailure


class LaunchError(Exception):
    """The instance cannot be started; ``failure`` says how to report it."""

    def __init__(self, cause: str, detail: str) -> None:
        super().__init__(detail)
        self.failure = LaunchFailure(cause=cause, detail=detail)


def candidates(reference: str) -> list[str]:
    """Catalog keys to try for an image reference, most specific first."""
    ref = reference.strip()
    out = [ref]
    first, sep, rest = ref.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        out.append(rest)
    last = ref.rsplit("/", 1)[-1]
    out.append(last)
    for item in list(out):
        bare = item.split("@", 1)[0]
        name, colon, tag = bare.rpartition(":")
        if colon and "/" not in tag:
            out.append(name)
    return list(dict.fromkeys(c for c in out if c))


def lookup(catalog: Mapping[str, Image], reference: str) -> tuple[str, Image] | None:
    """The catalog entry an image reference names."""
    for key in candidates(reference):
        if key in catalog:
            return key, catalog[key]
    return None


@attrs.frozen(kw_only=True)
class Command:
    """How to start one instance's inference server."""

    image: str
    argv: tuple[str, ...]
    cwd: Path
    env: Mapping[str, str]
    #: The port the server always uses (the image cannot be told another).
    fixed_port: int | None


def _fill(text: str, values: Mapping[str, str]) -> str:
    for key, value in values.items():
        text = text.replace("{" + key + "}", value)
    return text


def resolve(
    catalog: Mapping[str, Image],
    reference: str | None,
    container_args: str,
    *,
    port: int,
    python: str,
    instance_dir: Path,
    path: str,
) -> Command:
    """The command for an instance; raises :class:`LaunchError` (``image-pull-issues`` when it cannot run)."""
    if not reference:
        raise LaunchError(states.IMAGE_PULL_ISSUES, "the function names no containerImage")
    found = lookup(catalog, reference)
    if found is None:
        known = ", ".join(sorted(catalog)) or "none"
        raise LaunchError(
            states.IMAGE_PULL_ISSUES,
            f"image {reference!r} is not in this cluster's image catalog (the images: section of the config; "
            f"known: {known})",
        )
    key, image = found
    if not image.command:
        raise LaunchError(states.CREATE_CONTAINER_ERROR, f"image {key!r} has no command (images.{key}.command)")
    try:
        args = workload.container_args(container_args)
    except ValueError as err:
        raise LaunchError(states.CREATE_CONTAINER_ERROR, str(err)) from err
    values = {"port": str(image.port or port), "python": python, "instance_dir": str(instance_dir)}
    argv = (*(_fill(part, values) for part in image.command), *args)
    cwd = Path(_fill(str(image.cwd), values)).expanduser() if image.cwd is not None else instance_dir
    if not cwd.is_dir():
        raise LaunchError(
            states.CREATE_CONTAINER_ERROR, f"image {key!r}: working directory {cwd} does not exist (images.{key}.cwd)"
        )
    executable = argv[0]
    if os.sep in executable:
        target = Path(executable) if Path(executable).is_absolute() else cwd / executable
        if not target.exists():
            raise LaunchError(states.IMAGE_PULL_ISSUES, f"image {key!r}: command {executable!r} does not exist")
        if not os.access(target, os.X_OK) or target.is_dir():
            raise LaunchError(states.CREATE_CONTAINER_ERROR, f"image {key!r}: command {executable!r} is not executable")
    elif shutil.which(executable, path=path) is None:
        raise LaunchError(
            states.IMAGE_PULL_ISSUES, f"image {key!r}: command {executable!r} was not found on PATH ({path})"
        )
    return Command(
        image=key,
        argv=argv,
        cwd=cwd,
        env={k: _fill(v, values) for k, v in image.env.items()},
        fixed_port=image.port,
    )
