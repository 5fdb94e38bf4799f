"""Scale from zero, a burst at zero, and idle back to zero, on the local backend.

One all-in-one ``nvcf-mono run`` child process with its own cluster agent (instances are real
processes: the test echo server and ``nvcf-mono worker``), fast autoscaler timers, and this process
as the client. In one run:

(a) the function server's own start time, measured by starting it directly (spawn to a 200 from its
    health route); then, for a version at zero instances, the time from a request to its response.
    The platform's share of a cold start is the difference (budget: <= 1 s).
(b) a burst of 1,000 requests sent at once to a version at zero (max 4 instances, 16 slots each):
    every request must answer 200 with its own body; the time to drain is reported.
(c) from the last response to the instance being gone, minus the idle timeout.
"""

from __future__ import annotations

import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import anyio

from bench.invoke import platform_process
from nvcf_mono.ports import free_port
from nvcf_mono.testing.platform import Api, wait_for
from nvcf_mono.testing.running import ECHO_FUNCTION

IDLE_TIMEOUT = 3.0
#: Each burst request holds its slot this long, so one instance alone would take 1000 * 0.05 / 16 = 3 s.
BURST_DELAY = 0.05
#: Autoscaling in seconds, an instance's health looked at often: what every cold-start benchmark runs with.
TIMERS = (
    "plugins.control.reconcile.interval=0.5",
    "plugins.control.autoscaler.interval=0.5",
    "plugins.control.autoscaler.sample_step=1",
    "plugins.control.autoscaler.lookback=5",
    "plugins.control.autoscaler.utilization_window=2",
    f"plugins.control.autoscaler.idle_timeout={IDLE_TIMEOUT:g}",
    "plugins.invocation.load_report_interval=0.25",
    "plugins.compute.heartbeat_interval=0.5",
    "plugins.compute.health.probe_interval=0.05",
    "plugins.control.example_function=false",
)
SETTINGS = (
    *TIMERS,
    "images.echo.command=" + json.dumps(["{python}", "-m", "nvcf_mono.testing.echo_server", "--port", "{port}"]),
    "plugins.compute.clusters="
    + json.dumps(
        [{"name": "bench", "id": str(uuid.uuid4()), "gpu_discovery": "static", "gpus": [{"name": "H100", "count": 8}]}]
    ),
)


async def server_start_time(session: aiohttp.ClientSession) -> float:
    """Spawn the echo server directly; seconds until its health route answers 200."""
    port = free_port("127.0.0.1")
    started = time.perf_counter()
    proc = await anyio.open_process(
        [sys.executable, "-m", "nvcf_mono.testing.echo_server", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        return await healthy_after(session, port, started)
    finally:
        proc.terminate()
        with anyio.move_on_after(5, shield=True):
            await proc.wait()


async def healthy_after(session: aiohttp.ClientSession, port: int, started: float) -> float:
    """Seconds from ``started`` (perf_counter) until ``/health`` on ``port`` answers 200."""
    while True:
        try:
            async with session.get(f"http://127.0.0.1:{port}/health") as resp:
                if resp.status == 200:
                    return time.perf_counter() - started
        except aiohttp.ClientError:
            pass
        await anyio.sleep(0.005)


async def deployed_at_zero(api: Api, max_instances: int, concurrency: int) -> tuple[str, str]:
    """A new function deployed at min 0; (function id, deployment path) once ACTIVE."""
    fn = (await api.post("/v2/nvcf/functions", {**ECHO_FUNCTION, "name": f"cold-{uuid.uuid4().hex[:6]}"})).json
    fid, vid = fn["function"]["id"], fn["function"]["versionId"]
    path = f"/v2/nvcf/deployments/functions/{fid}/versions/{vid}"
    spec = {
        "gpu": "H100",
        "instanceType": "ON-PREM.GPU.H100_1x",
        "minInstances": 0,
        "maxInstances": max_instances,
        "maxRequestConcurrency": concurrency,
    }
    reply = await api.post(path, {"deploymentSpecifications": [spec]})
    assert reply.status == 200, reply.body
    await wait_for(lambda: _status(api, path, "ACTIVE"), timeout=60, what="ACTIVE")
    return fid, path


async def _status(api: Api, path: str, status: str) -> bool:
    return (await api.get(path)).json["deployment"]["functionStatus"] == status


async def placed(api: Api, path: str) -> int:
    spec = (await api.get(path)).json["deployment"]["deploymentSpecifications"][0]
    count: int = spec["placement"]["placedInstances"]
    return count


async def run(quick: bool = False) -> dict[str, Any]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    rounds = 2 if quick else 5
    burst = 200 if quick else 1000
    with tempfile.TemporaryDirectory(prefix="nvcf-bench-cold-") as tmp:
        async with (
            platform_process(Path(tmp) / "state", *SETTINGS, compute=True) as ep,
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session,
        ):
            admin = Api(session, ep["api_url"], ep["credentials"]["admin_token"])
            key = Api(session, ep["invocation_url"], ep["credentials"]["api_key"])

            async def registered() -> bool:
                return bool((await admin.get("/v1/accounts/nvcf-default/clusters")).json.get("clusters"))

            await wait_for(registered, timeout=30, what="the cluster")
            own = [await server_start_time(session) for _ in range(rounds)]

            # (a) and (c): a request at zero, then idle back to zero, several times.
            fid, path = await deployed_at_zero(admin, 2, 1)
            cold, to_zero = [], []
            for i in range(rounds):
                started = time.perf_counter()
                reply = await key.post(f"/v2/nvcf/pexec/functions/{fid}", {"message": str(i)})
                cold.append(time.perf_counter() - started)
                assert reply.status == 200 and reply.json["message"] == str(i), reply.body

                async def at_zero() -> bool:
                    return await placed(admin, path) == 0

                await wait_for(at_zero, timeout=IDLE_TIMEOUT + 30, what="back at zero")
                to_zero.append(time.perf_counter() - started - IDLE_TIMEOUT)  # idle counts from the call
                await anyio.sleep(0.5)  # the last instance's processes finish exiting

            # (b) a burst at zero.
            fid, path = await deployed_at_zero(admin, 4, 16)
            results: list[tuple[int, bool]] = []

            peak = 0

            async def one(i: int) -> None:
                reply = await key.post(f"/v2/nvcf/pexec/functions/{fid}", {"message": str(i), "delay": BURST_DELAY})
                results.append((reply.status, reply.status == 200 and reply.json.get("message") == str(i)))

            async def watch() -> None:
                nonlocal peak
                while True:
                    peak = max(peak, await placed(admin, path))
                    await anyio.sleep(0.1)

            started = time.perf_counter()
            async with anyio.create_task_group() as outer:
                outer.start_soon(watch)
                async with anyio.create_task_group() as tg:
                    for i in range(burst):
                        tg.start_soon(one, i)
                drained = time.perf_counter() - started
                outer.cancel_scope.cancel()

    own_p50, cold_p50 = statistics.median(own), statistics.median(cold)
    figures = {
        "server_start_p50_s": own_p50,
        "cold_start_p50_s": cold_p50,
        "cold_start_max_s": max(cold),
        "platform_share_p50_s": cold_p50 - own_p50,
        "idle_to_zero_after_timeout_p50_s": statistics.median(to_zero),
        "burst": burst,
        "burst_ok": sum(1 for _, ok in results if ok),
        "burst_drain_s": drained,
        "burst_peak_instances": peak,
    }
    print(f"function server's own start (p50 of {rounds}): {own_p50 * 1000:.0f} ms")
    print(
        f"(a) request at zero -> response: p50 {cold_p50 * 1000:.0f} ms, max {max(cold) * 1000:.0f} ms; "
        f"platform's share p50 {figures['platform_share_p50_s'] * 1000:.0f} ms (budget <= 1000 ms)"
    )
    print(
        f"(b) burst of {burst} at zero (max 4 x 16 slots): {figures['burst_ok']}/{burst} answered 200 with their "
        f"own body, drained in {drained:.2f} s, up to {peak} instance(s) ({BURST_DELAY * 1000:g} ms per request)"
    )
    print(
        f"(c) idle -> zero: instance gone p50 {figures['idle_to_zero_after_timeout_p50_s'] * 1000:.0f} ms after "
        f"the {IDLE_TIMEOUT:g} s idle timeout (counted from the call)"
    )
    return figures


def main() -> None:
    quick = "--quick" in sys.argv[1:]
    anyio.run(run, quick, backend="asyncio")


if __name__ == "__main__":
    main()
