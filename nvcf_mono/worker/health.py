"""The worker's own health endpoints and metrics (``HEALTH_PORT``): what probes, the agent and Prometheus look at."""

from __future__ import annotations

from collections.abc import Callable

import anyio
from aiohttp import web
from anyio.abc import TaskStatus

from nvcf_mono.metrics import CONTENT_TYPE, Metrics
from nvcf_mono.worker.agent import WorkerState


async def serve_health(
    state: WorkerState, port: int, *, task_status: TaskStatus[int] = anyio.TASK_STATUS_IGNORED
) -> None:
    """``/v1/health/live`` (the process runs), ``/v1/health/ready`` (it serves) and ``/metrics``
    (Prometheus text, read from the worker's state at each scrape); reports the port.
    """
    registry = worker_metrics(state)

    async def live(_: web.Request) -> web.Response:
        return web.json_response({"status": "live"})

    async def ready(_: web.Request) -> web.Response:
        body = {
            "status": "ready" if state.ready else "not ready",
            "inferenceHealthy": state.inference_healthy,
            "connected": state.connected,
            "draining": state.draining,
            "inFlight": state.in_flight,
            "served": state.served,
            "sessions": state.sessions,
        }
        if state.detail:
            body["detail"] = state.detail
        return web.json_response(body, status=200 if state.ready else 503)

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=registry.render().encode(), headers={"Content-Type": CONTENT_TYPE})

    app = web.Application()
    app.router.add_get("/v1/health/live", live)
    app.router.add_get("/v1/health/ready", ready)
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1" if port == 0 else "0.0.0.0", port)
        await site.start()
        bound = runner.addresses[0][1] if runner.addresses else port
        task_status.started(int(bound))
        await anyio.sleep_forever()
    finally:
        with anyio.move_on_after(2, shield=True):
            await runner.cleanup()


def worker_metrics(state: WorkerState) -> Metrics:
    """The worker's own series (NVCF's ``worker_thread_busy_seconds`` among them), read from its state."""
    registry = Metrics()

    def one(read: Callable[[], float]) -> Callable[[], list[tuple[tuple[str, ...], float]]]:
        return lambda: [((), float(read()))]

    registry.counter(
        "worker_thread_busy_seconds", "Slot-seconds spent serving requests (the autoscaler's utilization)."
    ).set_function(one(lambda: state.busy_seconds))
    registry.counter("nvcf_worker_requests_total", "Requests this worker finished serving.").set_function(
        one(lambda: state.served)
    )
    registry.gauge("nvcf_worker_requests_in_flight", "Requests being served now.").set_function(
        one(lambda: state.in_flight)
    )
    registry.gauge(
        "nvcf_worker_inference_healthy", "1 while the inference server answers its health check."
    ).set_function(one(lambda: state.inference_healthy))
    registry.gauge("nvcf_worker_connected", "1 while connected to the invocation plane.").set_function(
        one(lambda: state.connected)
    )
    registry.counter("nvcf_worker_sessions_total", "Sessions opened with the invocation plane.").set_function(
        one(lambda: state.sessions)
    )
    return registry
