"""``nvcf-mono worker``: the sidecar entrypoint, run beside each inference server."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import anyio

from nvcf_mono.state_dir import write_private
from nvcf_mono.worker.agent import Worker, fetch_secrets
from nvcf_mono.worker.config import WorkerConfig
from nvcf_mono.worker.health import serve_health

log = logging.getLogger("nvcf_mono.worker")


async def run_worker(worker: Worker, *, secrets: bool) -> None:
    """Health endpoints, secrets, then serve until drained or cancelled."""
    config = worker.config
    async with anyio.create_task_group() as tg:
        port = await tg.start(serve_health, worker.state, config.own_health_port)
        log.info("health endpoints on port %d", port)
        if secrets and config.secrets_file:
            values = await fetch_secrets(config)
            write_private(Path(config.secrets_file), json.dumps(values).encode())
            log.info("wrote %d secrets to %s", len(values), config.secrets_file)
        await worker.run()
        tg.cancel_scope.cancel()


def build(environ: dict[str, str]) -> tuple[Worker, bool]:
    """The worker for this environment, and whether it must fetch secrets first."""
    config = WorkerConfig.from_env(environ)
    return Worker(config), config.secrets_present
