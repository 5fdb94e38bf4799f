"""nvcf-mono against Ray Serve on the same echo, in one run: ``make bench-peers`` (or ``python -m bench.peers``).

Ray Serve runs from its own virtualenv (``.venv-peers``, made by ``make bench-peers``; another with
``NVCF_PEERS_PYTHON``), started by ``bench/peers/ray_echo.py`` on 127.0.0.1 with no dashboard: first
behind its default Python proxy, then nvcf-mono (the full ``nvcf-mono run`` path of
``bench/invoke.py``), then Ray behind its HAProxy mode (``RAY_SERVE_ENABLE_HA_PROXY=1``), one system at a
time on the same cores. Each: 1,000 sequential calls (64-byte bodies), then throughput at 16 and 64
connections (wrk when installed) with the CPU every process of the system used per request (from
``/proc``: Ray's driver, GCS, raylet, controller, proxy or HAProxy and replica; nvcf-mono's platform,
nats-server, worker and function). Ray's HAProxy mode is not durable; nvcf-mono stores every request
before it accepts it.
"""

from __future__ import annotations

import os
import signal
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

from bench.invoke import BODY, _call, _quantile, _settings, descendants, platform_process, throughput
from bench.invoke import _processes as platform_roles
from nvcf_mono.ports import free_port
from nvcf_mono.testing.platform import Api
from nvcf_mono.testing.running import ECHO_FUNCTION, deployed

HERE = Path(__file__).resolve().parent
PEERS_PYTHON = Path(os.environ.get("NVCF_PEERS_PYTHON", HERE.parent.parent / ".venv-peers" / "bin" / "python"))
KEY = {"Content-Type": "application/json"}


def _ray_roles(root: int) -> dict[int, str]:
    roles = {}
    for pid, argv in descendants(root).items():
        head = b" ".join(argv[:2])
        if b"haproxy" in argv[0]:
            roles[pid] = "haproxy"
        elif b"ProxyActor" in head:
            roles[pid] = "proxy"
        elif b"ServeReplica" in head:
            roles[pid] = "replica"
        else:
            roles[pid] = "ray"  # the driver, GCS, raylet, the Serve controller, Ray's agents
    return roles


def _kill_tree(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _spawn_ray(port: int, env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    with log_path.open("wb") as log:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            [str(PEERS_PYTHON), str(HERE / "ray_echo.py"), str(port)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            env=env,
            start_new_session=True,
        )


def _tail(path: Path) -> str:
    return path.read_text(errors="replace")[-3000:]


@asynccontextmanager
async def ray_serve(port: int, *, haproxy: bool) -> AsyncIterator[int]:
    """Ray Serve's echo on ``port``; yields the driver's pid. Every process it started is gone after."""
    env = {**os.environ, "RAY_SERVE_ENABLE_HA_PROXY": "1" if haproxy else "0", "RAY_USAGE_STATS_ENABLED": "0"}
    with tempfile.TemporaryDirectory(prefix="nvcf-peers-") as tmp:
        env["RAY_SERVE_HAPROXY_CONFIG_FILE_LOC"] = f"{tmp}/haproxy.cfg"
        env["RAY_SERVE_HAPROXY_SOCKET_PATH"] = f"{tmp}/admin.sock"
        env["RAY_SERVE_HAPROXY_SERVER_STATE_BASE"] = tmp
        env["RAY_SERVE_HAPROXY_SERVER_STATE_FILE"] = f"{tmp}/server-state"
        proc = _spawn_ray(port, env, Path(tmp, "ray.log"))
        assert proc.stdout is not None and proc.stdin is not None
        tree: list[int] = []
        try:
            with anyio.fail_after(240):
                line = await anyio.to_thread.run_sync(proc.stdout.readline)
            if line.strip() != b"ready":
                raise RuntimeError(f"Ray Serve did not start: {_tail(Path(tmp, 'ray.log'))}")
            tree = list(descendants(proc.pid))
            yield proc.pid
        finally:
            tree = sorted(set(tree) | set(descendants(proc.pid)))
            proc.stdin.close()  # the driver shuts Serve and Ray down
            try:
                await anyio.to_thread.run_sync(lambda: proc.wait(timeout=60))
            except subprocess.TimeoutExpired:
                proc.kill()
            _kill_tree(tree)  # whatever Ray left behind


async def measure(
    session: aiohttp.ClientSession, url: str, headers: dict[str, str], roles: dict[int, str], *, quick: bool
) -> dict[str, Any]:
    """Sequential latency, then throughput and CPU per request at 16 and 64 connections."""
    seconds = float(os.environ.get("NVCF_BENCH_SECONDS", "2" if quick else "8"))
    for _ in range(100):
        await _call(session, url, headers, BODY)
    latencies = [await _call(session, url, headers, BODY) for _ in range(200 if quick else 1000)]
    out: dict[str, Any] = {"p50_ms": _quantile(latencies, 0.5), "p99_ms": _quantile(latencies, 0.99)}
    for clients in (16, 64):
        stats = await throughput(session, url, headers, roles, clients=clients, seconds=seconds)
        stats["all_cpu_ms"] = sum(stats["cpu_ms"].values())
        out[f"load_{clients}"] = stats
    return out


async def measure_ray(session: aiohttp.ClientSession, *, haproxy: bool, quick: bool) -> dict[str, Any]:
    port = free_port("127.0.0.1")
    async with ray_serve(port, haproxy=haproxy) as pid:
        url = f"http://127.0.0.1:{port}/echo"
        await _call(session, url, KEY, BODY)
        return await measure(session, url, KEY, _ray_roles(pid), quick=quick)


async def measure_nvcf(session: aiohttp.ClientSession, *, quick: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="nvcf-peers-") as tmp:
        async with platform_process(Path(tmp) / "state", *_settings(), compute=True) as ep:
            admin = Api(session, ep["api_url"], ep["credentials"]["admin_token"], timeout=60)
            fid, _ = await deployed(admin, ECHO_FUNCTION, concurrency=64)
            key = {**KEY, "Authorization": f"Bearer {ep['credentials']['api_key']}"}
            url = f"{ep['api_url']}/v2/nvcf/pexec/functions/{fid}"
            return await measure(session, url, key, platform_roles(int(ep["pid"])), quick=quick)


async def run(quick: bool = False) -> dict[str, Any]:
    results: dict[str, Any] = {}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        results["ray"] = await measure_ray(session, haproxy=False, quick=quick)
        results["nvcf-mono"] = await measure_nvcf(session, quick=quick)
        results["ray-haproxy"] = await measure_ray(session, haproxy=True, quick=quick)
    report(results)
    return results


def report(results: dict[str, Any]) -> None:
    for name, r in results.items():
        loads = " | ".join(
            f"{c}: {r[f'load_{c}']['rps']:.0f} req/s, {r[f'load_{c}']['errors']:.0f} errors, "
            f"CPU {r[f'load_{c}']['all_cpu_ms']:.3f} ms/req, {r[f'load_{c}']['cores']:.2f} cores"
            for c in (16, 64)
        )
        print(f"peers {name}: sequential p50 {r['p50_ms']:.2f} ms p99 {r['p99_ms']:.2f} ms | {loads}")
    ours = results["nvcf-mono"]
    for peer in ("ray", "ray-haproxy"):
        theirs = results[peer]
        ratios = ", ".join(
            f"throughput at {c} {ours[f'load_{c}']['rps'] / theirs[f'load_{c}']['rps']:.2f}x, "
            f"CPU per request at {c} {ours[f'load_{c}']['all_cpu_ms'] / theirs[f'load_{c}']['all_cpu_ms']:.2f}x"
            for c in (16, 64)
        )
        print(f"peers nvcf-mono / {peer}: p50 {ours['p50_ms'] / theirs['p50_ms']:.2f}x, {ratios}")


def main() -> None:
    if not PEERS_PYTHON.exists():
        print(f"peers: skipped, no Ray Serve virtualenv at {PEERS_PYTHON} (make bench-peers makes it)")
        return
    started = time.monotonic()
    anyio.run(run, "--quick" in sys.argv, backend="asyncio")
    print(f"peers: {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
