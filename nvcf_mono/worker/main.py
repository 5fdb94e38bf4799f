"""``nvcf-mono worker``: the sidecar entrypoint, run beside each inference server (or task)."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

import anyio

from nvcf_mono.contracts import env
from nvcf_mono.state_dir import write_private
from nvcf_mono.worker.agent import Worker, WorkerState, fetch_secrets
from nvcf_mono.worker.config import WorkerConfig
from nvcf_mono.worker.health import serve_health
from nvcf_mono.worker.task import TaskConfig, TaskWorker

log = logging.getLogger("nvcf_mono.worker")
SECRETS_MODE = 0o640


class SidecarConfig(Protocol):
    @property
    def worker_token(self) -> str: ...
    @property
    def grpc_address(self) -> str: ...
    @property
    def grpc_address_file(self) -> str | None: ...
    @property
    def instance_id(self) -> str: ...
    @property
    def own_health_port(self) -> int: ...
    @property
    def secrets_file(self) -> str | None: ...


class Sidecar(Protocol):
    """A function instance's worker or a task's: what the entrypoint runs."""

    @property
    def config(self) -> SidecarConfig: ...
    @property
    def state(self) -> WorkerState: ...
    def request_drain(self) -> None: ...
    async def run(self) -> None: ...


async def run_worker(worker: Sidecar, *, secrets: bool) -> None:
    """Health endpoints, secrets, then serve until drained or cancelled."""
    config = worker.config
    async with anyio.create_task_group() as tg:
        port = await tg.start(serve_health, worker.state, config.own_health_port)
        log.info("health endpoints on port %d", port)
        if secrets and config.secrets_file:
            values = await fetch_secrets(config)
            # Group-readable: on a root platform the server runs as another user of the instance's own group
            # (the instance directory keeps everyone else out).
            write_private(Path(config.secrets_file), json.dumps(values).encode(), mode=SECRETS_MODE)
            log.info("wrote %d secrets to %s", len(values), config.secrets_file)
        await worker.run()
        tg.cancel_scope.cancel()


def build(environ: Mapping[str, str]) -> tuple[Sidecar, bool]:
    """The worker for this environment (a task's when ``NVCT_TASK_ID`` is set), and whether it must
    fetch secrets first.
    """
    if environ.get(env.NVCT_TASK_ID, "").strip():
        task = TaskConfig.from_env(environ)
        return TaskWorker(task), task.secrets_present
    config = WorkerConfig.from_env(environ)
    return Worker(config), config.secrets_present
