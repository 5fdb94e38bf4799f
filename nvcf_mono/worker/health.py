"""The worker's own health endpoints (``HEALTH_PORT``): what probes and the agent look at."""

from __future__ import annotations

import anyio
from aiohttp import web
from anyio.abc import TaskStatus

from nvcf_mono.worker.agent import WorkerState


async def serve_health(
    state: WorkerState, port: int, *, task_status: TaskStatus[int] = anyio.TASK_STATUS_IGNORED
) -> None:
    """``/v1/health/live`` (the process runs) and ``/v1/health/ready`` (it serves); reports the port."""

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

    app = web.Application()
    app.router.add_get("/v1/health/live", live)
    app.router.add_get("/v1/health/ready", ready)
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
