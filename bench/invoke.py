"""The invocation hot path through the full ``nvcf-mono up`` path: added latency, throughput, CPU.

One all-in-one ``nvcf-mono run`` child process (its embedded nats-server, its own cluster agent and
the local backend, which starts each instance as the function's server plus ``nvcf-mono worker``),
and this process as the client. In one run:

- **echo** (the test echo server, aiohttp): sequential calls straight to the server and through the
  platform, alternating, 64-byte bodies; the added latency is taken per pair of calls (a call through
  the platform minus the direct call next to it), so its p99 is a p99 of per-request additions;
- throughput through the platform at 16 and 64 connections (``wrk`` when installed, else an
  aiohttp load loop sharing the cores), with the CPU each process used (from ``/proc``) per request
  and the cores in use;
- **uvicorn, 2 workers** (``nvcf_mono.testing.asgi_echo``; a common production setting, and one that
  writes head and body separately): the same paired calls, and how many took over 20 ms (a stall);
- **streaming**: server-sent events of 128 bytes at saturation, events per second through the platform
  against the server called directly: 100 events per stream (the budget's figure: each stream also
  pays a whole request's cost), and 1,000 (the relay of events alone, as in a long LLM answer);
- **1 MiB request body**: paired calls, added p50 against the direct call's p50, and the floor under
  it: the MiB's round trip over loopback TCP alone, of which the platform's path makes three more than
  the direct call. The SSE figures likewise end with what a 10 % loss allows per stream, beside what an
  echo call alone costs.

Budgets (issue 18): CPU per request over platform, worker and nats-server <= 0.6 ms at 16 connections;
>= 2,000 req/s at 16 and 64 with zero errors; added p50 <= 1 ms and p99 <= 5 ms; no stalls; streaming
loses <= 10 %; 1 MiB added p50 <= 2x direct.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import anyio.to_thread

from nvcf_mono.testing.platform import Api, wait_for
from nvcf_mono.testing.running import ECHO_FUNCTION, deployed

BODY = b'{"pad": "' + b"x" * 52 + b'"}'  # 64 bytes
MIB = os.urandom(1024 * 1024)
#: Events per stream: the budget's short streams, and long ones.
SSE_EVENTS = (100, 1000)


def sse_request(events: int) -> bytes:
    """About 128 bytes per event: ``data: {"index": N, "message": "..."}`` and its blank line."""
    return json.dumps({"stream": True, "repeats": events, "message": "m" * 90}).encode()


UVICORN_FUNCTION = {**ECHO_FUNCTION, "name": "echo-uvicorn", "containerImage": "echo-uvicorn"}


def bench_cluster() -> str:
    """``plugins.compute.clusters`` for one local cluster of 8 pretend H100 (never the machine's GPUs)."""
    cluster = {
        "name": "bench",
        "id": str(uuid.uuid4()),
        "gpu_discovery": "static",
        "gpus": [{"name": "H100", "count": 8}],
    }
    return "plugins.compute.clusters=" + json.dumps([cluster])


def _settings() -> tuple[str, ...]:
    uvicorn = ["{python}", "-m", "uvicorn", "nvcf_mono.testing.asgi_echo:app", "--port", "{port}", "--workers", "2"]
    return (
        "plugins.control.example_function=false",
        "images.echo.command=" + json.dumps(["{python}", "-m", "nvcf_mono.testing.echo_server", "--port", "{port}"]),
        "images.echo-uvicorn.command=" + json.dumps([*uvicorn, "--lifespan", "off", "--log-level", "warning"]),
        bench_cluster(),
    )


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
            doc["pid"] = proc.pid
            return doc if doc["credentials"].get("api_key") else None

        yield await wait_for(ready, timeout=60, what="the platform")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


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


def descendants(root: int) -> dict[int, list[bytes]]:
    """``root`` and every process under it, with its command line."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
    found, todo = [root], [root]
    while todo:
        parent = todo.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent]
        found += children
        todo += children
    tree = {}
    for pid in found:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                tree[pid] = f.read().split(b"\0")
        except OSError:
            continue
    return tree


def _processes(root: int) -> dict[int, str]:
    """The platform's processes, each named by its role: platform, nats, worker or function."""
    roles = {}
    for pid, argv in descendants(root).items():
        if pid == root:
            roles[pid] = "platform"
        elif any(a.endswith(b"nats-server") for a in argv):
            roles[pid] = "nats"
        elif b"worker" in argv:
            roles[pid] = "worker"
        else:
            roles[pid] = "function"
    return roles


def _cpu_seconds(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU seconds per role over an interval, from ``/proc`` (user + system time)."""

    def __init__(self, roles: dict[int, str]) -> None:
        self._roles = roles
        self._start = {pid: _cpu_seconds(pid) for pid in roles}
        self._wall = time.perf_counter()

    def read(self) -> tuple[dict[str, float], float]:
        used: dict[str, float] = {}
        for pid, role in self._roles.items():
            used[role] = used.get(role, 0.0) + _cpu_seconds(pid) - self._start[pid]
        return used, time.perf_counter() - self._wall


def _function_port(roles: dict[int, str], image: str) -> int:
    """The port the local backend gave the function's server (its ``--port`` argument)."""
    for pid, role in roles.items():
        if role != "function":
            continue
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode() for a in f.read().split(b"\0")]
        if (image == "echo-uvicorn") == any("asgi_echo" in a for a in argv) and "--port" in argv:
            return int(argv[argv.index("--port") + 1])
    raise RuntimeError(f"no server of {image} found among the platform's processes")


async def _call(session: aiohttp.ClientSession, url: str, headers: dict[str, str], body: bytes) -> float:
    started = time.perf_counter()
    async with session.post(url, data=body, headers=headers) as resp:
        await resp.read()
        if resp.status != 200:
            raise RuntimeError(f"{url} answered {resp.status}: {(await resp.read())[:300]!r}")
    return (time.perf_counter() - started) * 1000


async def paired(
    session: aiohttp.ClientSession, urls: tuple[str, str], key: dict[str, str], n: int, *, body: bytes = BODY
) -> dict[str, float]:
    """Direct and platform calls alternating; the added latency of each pair, and its quantiles."""
    direct, through = urls
    d_ms, p_ms, added = [], [], []
    for _ in range(n):
        d = await _call(session, direct, {"Content-Type": "application/json"}, body)
        p = await _call(session, through, key, body)
        d_ms.append(d)
        p_ms.append(p)
        added.append(p - d)
    return {
        "direct_p50_ms": _quantile(d_ms, 0.5),
        "direct_p99_ms": _quantile(d_ms, 0.99),
        "platform_p50_ms": _quantile(p_ms, 0.5),
        "platform_p99_ms": _quantile(p_ms, 0.99),
        "added_p50_ms": _quantile(added, 0.5),
        "added_p99_ms": _quantile(added, 0.99),
        "over_20ms": float(sum(1 for p in p_ms if p > 20)),
    }


async def _load(
    session: aiohttp.ClientSession, url: str, headers: dict[str, str], clients: int, seconds: float
) -> dict[str, float]:
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
    return {"rps": done / (time.perf_counter() - started), "done": done, "errors": errors}


async def throughput(
    session: aiohttp.ClientSession,
    through: str,
    key: dict[str, str],
    roles: dict[int, str],
    *,
    clients: int,
    seconds: float,
) -> dict[str, Any]:
    """Requests per second at ``clients`` connections, and the CPU each role spent per request."""
    meter = CpuMeter(roles)
    if shutil.which("wrk"):
        stats: dict[str, Any] = await anyio.to_thread.run_sync(_wrk, through, key, clients, seconds)
        stats.setdefault("errors", 0)
    else:
        stats = await _load(session, through, key, clients, seconds)
    used, wall = meter.read()
    done = max(1.0, float(stats.get("done", 0)))
    stats["cpu_ms"] = {role: used[role] * 1000 / done for role in sorted(used)}
    stats["platform_cpu_ms"] = sum(v for r, v in stats["cpu_ms"].items() if r != "function")
    stats["cores"] = sum(used.values()) / wall
    return stats


async def streaming(
    session: aiohttp.ClientSession,
    url: str,
    headers: dict[str, str],
    clients: int,
    seconds: float,
    *,
    per_stream: int = SSE_EVENTS[0],
    roles: dict[int, str] | None = None,
) -> dict[str, Any]:
    """Server-sent events per second received by ``clients`` concurrent streaming calls, and the CPU
    each role (this process as ``client``) spent per stream.
    """
    body = sse_request(per_stream)
    events = streams = 0
    stop = time.perf_counter() + seconds
    meter = CpuMeter({**(roles or {}), os.getpid(): "client"})

    async def client() -> None:
        nonlocal events, streams
        while time.perf_counter() < stop:
            async with session.post(url, data=body, headers={**headers, "Accept": "text/event-stream"}) as resp:
                if resp.status != 200:
                    raise RuntimeError(f"{url} answered {resp.status}")
                async for line in resp.content:
                    if line.startswith(b"data:"):
                        events += 1
            streams += 1

    started = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(clients):
            tg.start_soon(client)
    used, wall = meter.read()
    return {
        "events_per_s": events / (time.perf_counter() - started),
        "cpu_ms": {role: used[role] * 1000 / max(1, streams) for role in sorted(used)},
        "cores": sum(used.values()) / wall,
    }


def sse_figures(direct: dict[str, Any], through: dict[str, Any]) -> dict[str, float]:
    """The streaming loss, and the CPU per stream behind it.

    At saturation the function, the client and the platform's processes share the same cores: a CPU
    millisecond the platform spends on a stream is one the function and the client lack. With ``d`` ms
    per stream for those two called directly, ``f`` for the same two through the platform and ``p`` for
    the platform's processes, the loss is about ``1 - d / (f + p)`` while both runs fill the cores, so a
    10 % loss needs ``f + p <= 1.11 d``.
    """
    ours = ("platform", "worker", "nats")
    theirs = ("function", "client")
    return {
        "direct": direct["events_per_s"],
        "through": through["events_per_s"],
        "loss": 1 - through["events_per_s"] / direct["events_per_s"],
        "direct_cpu_ms": sum(direct["cpu_ms"].get(role, 0.0) for role in theirs),
        "direct_cores": direct["cores"],
        "their_cpu_ms": sum(through["cpu_ms"].get(role, 0.0) for role in theirs),
        "platform_cpu_ms": sum(ms for role, ms in through["cpu_ms"].items() if role in ours),
        "through_cores": through["cores"],
    }


_ECHO_BYTES = r"""
import asyncio, sys
async def main():
    size = int(sys.argv[1])
    async def handle(reader, writer):
        try:
            while True:
                writer.write(await reader.readexactly(size))
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()
    server = await asyncio.start_server(handle, "127.0.0.1", 0, limit=1 << 22)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()
asyncio.run(main())
"""


async def socket_round_trip(body: bytes, n: int) -> float:
    """p50 ms of ``body`` sent to another process over loopback TCP and read back, both ends asyncio
    streams and nothing else: the floor of one round trip of the body on this machine.

    Through the platform a body crosses eight sockets (client, platform, nats-server and back, worker,
    function and back to the client), called directly two: three round trips more at the least.
    """
    async with await anyio.open_process([sys.executable, "-c", _ECHO_BYTES, str(len(body))]) as proc:
        assert proc.stdout is not None
        announced = b""
        while not announced.endswith(b"\n"):
            announced += await proc.stdout.receive()
        reader, writer = await asyncio.open_connection("127.0.0.1", int(announced), limit=1 << 22)
        times = []
        for _ in range(n):
            started = time.perf_counter()
            writer.write(body)
            await reader.readexactly(len(body))
            times.append((time.perf_counter() - started) * 1000)
        writer.close()
        proc.kill()
    return _quantile(times, 0.5)


async def run(quick: bool = False, *settings: str) -> dict[str, Any]:
    n = 200 if quick else 1000
    seconds = float(os.environ.get("NVCF_BENCH_SECONDS", "2" if quick else "8"))
    uvicorn = importlib.util.find_spec("uvicorn") is not None
    results: dict[str, Any] = {"load_generator": "wrk" if shutil.which("wrk") else "aiohttp"}
    with tempfile.TemporaryDirectory(prefix="nvcf-bench-") as tmp:
        state = Path(tmp) / "state"
        async with (
            platform_process(state, *_settings(), *settings, compute=True) as ep,
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session,
        ):
            admin = Api(session, ep["api_url"], ep["credentials"]["admin_token"], timeout=60)
            key = {"Authorization": f"Bearer {ep['credentials']['api_key']}", "Content-Type": "application/json"}
            functions = {"echo": (await deployed(admin, ECHO_FUNCTION, concurrency=64))[0]}
            if uvicorn:
                functions["echo-uvicorn"] = (await deployed(admin, UVICORN_FUNCTION, concurrency=64))[0]
            roles = _processes(int(ep["pid"]))
            urls = {
                name: (
                    f"http://127.0.0.1:{_function_port(roles, name)}/echo",
                    f"{ep['api_url']}/v2/nvcf/pexec/functions/{fid}",
                )
                for name, fid in functions.items()
            }
            direct, through = urls["echo"]
            await paired(session, urls["echo"], key, 100)  # warm up
            results["echo"] = await paired(session, urls["echo"], key, n)
            for clients in (16, 64):
                results[f"load_{clients}"] = await throughput(
                    session, through, key, roles, clients=clients, seconds=seconds
                )
            if uvicorn:
                await paired(session, urls["echo-uvicorn"], key, 50)
                results["uvicorn"] = await paired(session, urls["echo-uvicorn"], key, n // 2)
            for events in SSE_EVENTS:
                sse_direct = await streaming(session, direct, {}, 16, seconds / 2, per_stream=events, roles=roles)
                sse_through = await streaming(session, through, key, 16, seconds / 2, per_stream=events, roles=roles)
                results[f"sse_{events}"] = sse_figures(sse_direct, sse_through)
            results["mib"] = await paired(session, urls["echo"], key, 20 if quick else 50, body=MIB)
            results["mib"]["round_trip_ms"] = await socket_round_trip(MIB, 20 if quick else 50)
    report(results)
    return results


def _loss(theirs_ms: float, ours_ms: float) -> float:
    """The streaming loss at saturation when the platform's processes spend ``ours_ms`` per stream and the
    function and client ``theirs_ms`` (see ``sse_figures``).
    """
    return ours_ms / (theirs_ms + ours_ms)


def report(results: dict[str, Any]) -> None:
    def line(name: str, r: dict[str, float]) -> str:
        return (
            f"invoke {name}: direct p50 {r['direct_p50_ms']:.2f} p99 {r['direct_p99_ms']:.2f} ms | platform "
            f"p50 {r['platform_p50_ms']:.2f} p99 {r['platform_p99_ms']:.2f} ms | added (per request) "
            f"p50 {r['added_p50_ms']:.2f} p99 {r['added_p99_ms']:.2f} ms | calls over 20 ms: {r['over_20ms']:.0f}"
        )

    print(line("echo, 64 B", results["echo"]))
    for clients in (16, 64):
        r = results[f"load_{clients}"]
        cpu = ", ".join(f"{role} {ms:.3f}" for role, ms in r["cpu_ms"].items())
        latency = f", p50 {r['p50_ms']:.2f} p99 {r['p99_ms']:.2f} ms" if r.get("p50_ms") is not None else ""
        print(
            f"invoke: {clients} connections {r['rps']:.0f} req/s ({r['done']:.0f} ok, {r['errors']:.0f} errors"
            f"{latency}; {results['load_generator']}) | CPU ms per request: {cpu}; platform+worker+nats "
            f"{r['platform_cpu_ms']:.3f} | cores in use {r['cores']:.2f}"
        )
    if "uvicorn" in results:
        print(line("uvicorn --workers 2", results["uvicorn"]))
    else:
        print("invoke uvicorn: skipped (uvicorn is not installed: pip install -e '.[bench]')")
    for events in SSE_EVENTS:
        sse = results[f"sse_{events}"]
        print(
            f"invoke SSE 128 B events, 16 streams of {events}: direct {sse['direct']:.0f}/s, through the "
            f"platform {sse['through']:.0f}/s, loss {sse['loss'] * 100:.0f} % | CPU ms per stream: function and "
            f"client {sse['direct_cpu_ms']:.3f} direct ({sse['direct_cores']:.2f} cores), {sse['their_cpu_ms']:.3f} "
            f"through the platform, platform+worker+nats {sse['platform_cpu_ms']:.3f} ({sse['through_cores']:.2f} "
            f"cores)"
        )
    # A stream costs the platform at least what an echo call does (sse_figures: loss ~ p / (d + p)).
    sse, per_call = results[f"sse_{SSE_EVENTS[0]}"], results["load_16"]["platform_cpu_ms"]
    print(
        f"invoke SSE, 16 streams of {SSE_EVENTS[0]}: a 10 % loss allows platform+worker+nats "
        f"{sse['direct_cpu_ms'] / 9:.3f} ms per stream, the relay of its events included; an echo call alone "
        f"costs them {per_call:.3f} ms (16 connections), a loss of {_loss(sse['direct_cpu_ms'], per_call) * 100:.0f} % "
        f"if relaying cost nothing"
    )
    mib = results["mib"]
    floor = 3 * mib["round_trip_ms"]
    print(
        line("1 MiB body", mib) + f" | added p50 / direct p50 {mib['added_p50_ms'] / mib['direct_p50_ms']:.2f}x | "
        f"floor: the MiB there and back over loopback TCP alone {mib['round_trip_ms']:.2f} ms, three more round "
        f"trips than the direct call {floor:.2f} ms ({floor / mib['direct_p50_ms']:.2f}x direct)"
    )


def main() -> None:
    quick = "--quick" in sys.argv
    settings = [a for a in sys.argv[1:] if a != "--quick"]
    anyio.run(run, quick, *settings, backend="asyncio")


if __name__ == "__main__":
    main()
