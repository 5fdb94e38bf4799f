"""``nvcf-mono worker``: the sidecar entrypoint, run beside each inference server (or task)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

import anyio

from nvcf_mono import tracing
from nvcf_mono.contracts import env, trace
from nvcf_mono.contracts.telemetry import targets
from nvcf_mono.worker import endpoint
from nvcf_mono.worker.agent import Worker, WorkerState
from nvcf_mono.worker.config import WorkerConfig
from nvcf_mono.worker.health import serve_health
from nvcf_mono.worker.secrets import fetch_secrets, keep_secrets_current, renew_credentials, write_secrets
from nvcf_mono.worker.task import TaskConfig, TaskWorker
from nvcf_mono.worker.telemetry import InstanceTelemetry

log = logging.getLogger("nvcf_mono.worker")


class SidecarConfig(endpoint.Dial, Protocol):
    @property
    def worker_token(self) -> str: ...
    @property
    def instance_id(self) -> str: ...
    @property
    def own_health_port(self) -> int: ...
    @property
    def secrets_file(self) -> str | None: ...
    @property
    def secrets_refresh(self) -> float: ...
    @property
    def telemetry_exports(self) -> str | None: ...
    @property
    def telemetry_proxy(self) -> str | None: ...


class Sidecar(Protocol):
    """A function instance's worker or a task's: what the entrypoint runs."""

    @property
    def config(self) -> SidecarConfig: ...
    @property
    def state(self) -> WorkerState: ...
    def request_drain(self) -> None: ...
    async def run(self) -> None: ...


async def run_worker(worker: Sidecar, *, secrets: bool) -> None:
    """Health endpoints, secrets, then serve until drained or cancelled (traced when the platform traces,
    and sending the function's telemetry where it has endpoints).
    """
    config = worker.config
    exports = targets(config.telemetry_exports, config.telemetry_proxy)
    observed = observe(worker, exports)
    try:
        await _serve(worker, config, exports, secrets=secrets)
    finally:
        with anyio.CancelScope(shield=True), anyio.move_on_after(10):
            if observed is not None:
                await anyio.to_thread.run_sync(observed.shutdown)  # the last metrics and log records go out
            if tracing.enabled():
                await anyio.to_thread.run_sync(tracing.shutdown)  # what is left goes out


def observe(worker: Sidecar, exports: Mapping[str, tracing.OtlpTarget]) -> InstanceTelemetry | None:
    """Tracing to the platform's collector and the workload's traces endpoint; a function instance's
    request metrics (recorded by its worker) and the worker's log to the workload's other endpoints.

    Without OpenTelemetry installed, the workload's telemetry is not sent and the log says why (the
    platform's own tracing, configured by its operator, fails the start as it always has).
    """
    config = worker.config
    resource = {"service.name": "nvcf-mono-worker", "service.instance.id": config.instance_id}
    traced: list[tracing.OtlpTarget] = []
    if isinstance(config, WorkerConfig):
        resource |= {trace.FUNCTION_ID: config.function_id, trace.FUNCTION_VERSION_ID: config.function_version_id}
        if config.traces_endpoint:
            traced.append(tracing.OtlpTarget.at(config.traces_endpoint, "traces"))
    elif isinstance(config, TaskConfig):
        resource[trace.TASK_ID] = config.task_id
    if "traces" in exports and isinstance(worker, Worker):  # a task's worker serves no invocations to trace
        traced.append(exports["traces"])
    metrics = exports.get("metrics") if isinstance(worker, Worker) else None
    observed = None
    try:
        if traced:
            tracing.setup(traced, "nvcf-mono-worker", resource=resource)
        if metrics is not None or "logs" in exports:
            observed = InstanceTelemetry(metrics, exports.get("logs"), resource)
    except (tracing.TracingUnavailable, ImportError) as err:
        if isinstance(config, WorkerConfig) and config.traces_endpoint:
            raise
        log.error(
            "the workload's telemetry (%s) is not sent: OpenTelemetry is not installed beside the worker "
            "(pip install 'nvcf-mono[otel]'): %s",
            ", ".join(sorted(exports)),
            err,
        )
    if isinstance(worker, Worker):
        worker.telemetry = observed
    return observed


async def _serve(
    worker: Sidecar, config: SidecarConfig, exports: Mapping[str, tracing.OtlpTarget], *, secrets: bool
) -> None:
    async with anyio.create_task_group() as tg:
        port = await tg.start(serve_health, worker.state, config.own_health_port)
        log.info("health endpoints on port %d", port)
        path = Path(config.secrets_file) if config.secrets_file else None
        written: dict[str, object] | None = None
        if path is not None and secrets:
            fetched = await fetch_secrets(config)
            write_secrets(path, fetched.values)
            written = fetched.values
            renew_credentials(exports, fetched.telemetry_exports)
        if config.secrets_refresh > 0 and (path is not None or exports):
            # Also without secrets at launch: the account's or function's first ones arrive the same way;
            # and a telemetry endpoint's replaced secret.
            tg.start_soon(keep_secrets_current, config, config.secrets_refresh, path, written, exports)
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
