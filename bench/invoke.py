"""The invocation hot path: latency added over calling the function directly, and throughput.

One all-in-one ``nvcf-mono`` process (its embedded nats-server beside it), one instance of the echo
function (the test echo server and ``nvcf-mono worker``, launched by a scripted agent in this
process exactly as an agent would), and this process as the client. In one run: sequential
latency straight to the echo server and through the platform (64-byte bodies, warm), then
throughput through the platform at 16 and 64 concurrent clients. Budgets (ARCHITECTURE §6): added
p50 <= 2 ms, p99 <= 10 ms, >= 1,000 req/s with zero errors.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import anyio.to_thread

from nvcf_mono.bus.nats import NatsBus, open_nats_bus
from nvcf_mono.config.model import BusSettings
from nvcf_mono.metrics import Metrics
from nvcf_mono.testing.platform import Api, wait_for
from nvcf_mono.testing.running import ECHO_FUNCTION
from nvcf_mono.testing.scripted_agent import ProcessLauncher, ScriptedAgent, gpu_inventory

BODY = b'{"pad": "' + b"x" * 52 + b'"}'  # 64 bytes


def _spawn(state: Path, flags: list[str]) -> subprocess.Popen[bytes]:
    state.mkdir(parents=True, exist_ok=True)
    with (state / "platform.log").open("ab") as log:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            [sys.executable, "-m", "nvcf_mono", "run", "--role", "all-in-one", "--state-dir", str(state), *flags],
            stdout=log,
            stderr=log,
        )


@asynccontextmanager
async def platform_process(state: Path, *settings: str, compute: bool = False) -> AsyncIterator[dict[str, Any]]:
    """``nvcf-mono run`` (all-in-one) as a child process; yields its endpoints.json.

    Without ``compute`` the instance comes from a scripted agent in the benchmark (one echo server and
    worker, measured directly); with it, the platform's own agent and local backend start instances.
    """
    flags = ["--set", "http.port=0", "--set", "grpc.port=0", "--set", "embedded_nats.port=0"]
    if not compute:
        flags += ["--set", "plugins.compute.enabled=false"]
    for item in settings:
        flags += ["--set", item]
    proc = _spawn(state, flags)
    try:
        endpoints = state / "endpoints.json"

        async def ready() -> dict[str, Any] | None:
            if proc.poll() is not None:
                raise RuntimeError(f"the platform exited: {(state / 'platform.log').read_text()[-3000:]}")
            if not endpoints.exists():
                return None
            doc: dict[str, Any] = json.loads(endpoints.read_text())
            return doc if doc["credentials"].get("api_key") else None

        yield await wait_for(ready, timeout=60, what="the platform")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


@asynccontextmanager
async def bus_of(url: str) -> AsyncIterator[NatsBus]:
    async with open_nats_bus(
        BusSettings(connect_retry_for=10.0),
        servers=[url],
        name="bench",
        metrics=Metrics(),
        log=logging.getLogger("bench.bus"),
    ) as bus:
        yield bus


WRK_SCRIPT = """
wrk.method = "POST"
wrk.body = '%s'
wrk.headers["Content-Type"] = "application/json"
%s
"""


def _wrk(url: str, headers: dict[str, str], connections: int, seconds: float) -> dict[str, float]:
    """Drive ``url`` with wrk (a C load generator: the client's cost stays out of the figures)."""
    lines = "\n".join(f'wrk.headers["{k}"] = "{v}"' for k, v in headers.items() if k != "Content-Type")
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(WRK_SCRIPT % (BODY.decode(), lines))
    out = subprocess.run(
        ["wrk", "-t", "1", "-c", str(connections), "-d", f"{seconds:g}s", "--latency", "-s", script.name, url],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    os.unlink(script.name)
    stats: dict[str, float] = {}
    for line in out.splitlines():
        parts = line.split()
        if line.startswith("Requests/sec:"):
            stats["rps"] = float(parts[1])
        elif len(parts) == 2 and parts[0] in ("50%", "99%"):
            stats[f"p{parts[0][:-1]}_ms"] = _ms(parts[1])
        elif "Non-2xx or 3xx responses:" in line:
            stats["errors"] = float(parts[-1])
        elif line.strip().startswith("Socket errors:"):
            stats["errors"] = stats.get("errors", 0) + sum(int(p.strip(",")) for p in parts if p.strip(",").isdigit())
        elif "requests in" in line:
            stats["done"] = float(parts[0])
    return stats


def _ms(text: str) -> float:
    for unit, scale in (("us", 0.001), ("ms", 1.0), ("s", 1000.0)):
        if text.endswith(unit):
            return float(text[: -len(unit)]) * scale
    return float(text)


def _quantile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


async def _sequential(session: aiohttp.ClientSession, url: str, headers: dict[str, str], n: int) -> list[float]:
    out = []
    for _ in range(n):
        started = time.perf_counter()
        async with session.post(url, data=BODY, headers=headers) as resp:
            await resp.read()
            if resp.status != 200:
                raise RuntimeError(f"{url} answered {resp.status}")
        out.append((time.perf_counter() - started) * 1000)
    return out


async def _load(
    session: aiohttp.ClientSession, url: str, headers: dict[str, str], clients: int, seconds: float
) -> tuple[float, int, int]:
    done = errors = 0
    stop = time.perf_counter() + seconds

    async def client() -> None:
        nonlocal done, errors
        while time.perf_counter() < stop:
            try:
                async with session.post(url, data=BODY, headers=headers) as resp:
                    await resp.read()
                    if resp.status == 200:
                        done += 1
                    else:
                        errors += 1
            except aiohttp.ClientError:
                errors += 1

    started = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(clients):
            tg.start_soon(client)
    return done / (time.perf_counter() - started), done, errors


async def run(quick: bool = False, *settings: str) -> dict[str, Any]:
    n = 200 if quick else 1000
    seconds = float(os.environ.get("NVCF_BENCH_SECONDS", "2" if quick else "8"))
    with tempfile.TemporaryDirectory(prefix="nvcf-bench-") as tmp:
        root = Path(tmp)
        async with platform_process(root / "state", *settings) as ep, bus_of(ep["nats_url"]) as bus:
            launcher = ProcessLauncher(root / "instances", environ=dict(os.environ))
            agent = ScriptedAgent(
                bus,
                cluster_id="00000000-0000-4000-8000-0000000bench",
                cluster_name="bench",
                gpus=[gpu_inventory("H100", 8)],
                behaviour="launch",
                launcher=launcher,
            )
            async with (
                anyio.create_task_group() as tg,
                aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session,
            ):
                await tg.start(agent.run)
                admin = Api(session, ep["api_url"], ep["credentials"]["admin_token"], timeout=60)
                created = (await admin.post("/v2/nvcf/functions", ECHO_FUNCTION)).json["function"]
                d = f"/v2/nvcf/deployments/functions/{created['id']}/versions/{created['versionId']}"
                spec = {
                    "gpu": "H100",
                    "instanceType": "ON-PREM.GPU.H100_1x",
                    "minInstances": 1,
                    "maxInstances": 1,
                    "maxRequestConcurrency": 64,
                }
                await admin.post(d, {"deploymentSpecifications": [spec]})

                async def active() -> bool:
                    return bool((await admin.get(d)).json["deployment"]["functionStatus"] == "ACTIVE")

                await wait_for(active, timeout=60, what="ACTIVE")
                instance = next(iter(launcher.running.values()))
                direct = f"http://127.0.0.1:{instance.inference_port}/echo"
                through = f"{ep['api_url']}/v2/nvcf/pexec/functions/{created['id']}"
                key = {"Authorization": f"Bearer {ep['credentials']['api_key']}", "Content-Type": "application/json"}
                await _sequential(session, through, key, 100)  # warm up
                await _sequential(session, direct, {}, 100)
                d_ms = await _sequential(session, direct, {}, n)
                p_ms = await _sequential(session, through, key, n)
                results: dict[str, Any] = {
                    "direct_p50_ms": _quantile(d_ms, 0.5),
                    "direct_p99_ms": _quantile(d_ms, 0.99),
                    "platform_p50_ms": _quantile(p_ms, 0.5),
                    "platform_p99_ms": _quantile(p_ms, 0.99),
                }
                results["added_p50_ms"] = results["platform_p50_ms"] - results["direct_p50_ms"]
                results["added_p99_ms"] = results["platform_p99_ms"] - results["direct_p99_ms"]
                results["load_generator"] = "wrk" if shutil.which("wrk") else "aiohttp"
                for clients in (16, 64):
                    if shutil.which("wrk"):
                        stats = await anyio.to_thread.run_sync(_wrk, through, key, clients, seconds)
                        rate, done, errors = stats["rps"], int(stats.get("done", 0)), int(stats.get("errors", 0))
                        results[f"p50_ms_{clients}"] = stats.get("p50_ms")
                        results[f"p99_ms_{clients}"] = stats.get("p99_ms")
                    else:
                        rate, done, errors = await _load(session, through, key, clients, seconds)
                    results[f"rps_{clients}"] = rate
                    results[f"errors_{clients}"] = errors
                    results[f"done_{clients}"] = done
                tg.cancel_scope.cancel()
    print(
        f"invoke: direct p50 {results['direct_p50_ms']:.2f} ms p99 {results['direct_p99_ms']:.2f} ms | "
        f"platform p50 {results['platform_p50_ms']:.2f} ms p99 {results['platform_p99_ms']:.2f} ms | "
        f"added p50 {results['added_p50_ms']:.2f} ms p99 {results['added_p99_ms']:.2f} ms"
    )
    for clients in (16, 64):
        latency = ""
        if results.get(f"p50_ms_{clients}") is not None:
            latency = f", p50 {results[f'p50_ms_{clients}']:.2f} ms p99 {results[f'p99_ms_{clients}']:.2f} ms"
        print(
            f"invoke: {clients} clients {results[f'rps_{clients}']:.0f} req/s "
            f"({results[f'done_{clients}']} ok, {results[f'errors_{clients}']} errors{latency}; "
            f"{results['load_generator']})"
        )
    return results


def main() -> None:
    quick = "--quick" in sys.argv
    settings = [a for a in sys.argv[1:] if a != "--quick"]
    anyio.run(run, quick, *settings, backend="asyncio")


if __name__ == "__main__":
    main()
