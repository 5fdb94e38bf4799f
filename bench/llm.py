"""Streamed chat completions through the LLM gateway against the example model server called directly.

One all-in-one ``nvcf-mono run`` child process (compute plane, local backend) serves two functions of
the example model (``nvcf_mono.examples.llm``): one paced at 100 tokens a second (what a user feels:
time to first token, time between tokens) and one unpaced (tokens per second at saturation). Each
round streams ``chat/completions`` at one concurrency, alternating: straight to the server, then
through ``/v1/chat/completions`` on the platform. Budgets (issue 22): added time to first token
<= 2 ms at p50, added time per token <= 0.5 ms.
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import anyio

from bench.invoke import CpuMeter, _processes, _quantile, bench_cluster, platform_process
from nvcf_mono.testing.platform import Api, wait_status
from nvcf_mono.testing.running import LLM_FUNCTION

TOKENS = 32


def _settings() -> tuple[str, ...]:
    server = ["{python}", "-m", "nvcf_mono.examples.llm", "--port", "{port}"]
    return (
        "plugins.control.example_function=false",
        "images.llm-paced.command=" + json.dumps([*server, "--model", "paced", "--tokens-per-second", "100"]),
        "images.llm-fast.command=" + json.dumps([*server, "--model", "fast", "--tokens-per-second", "0"]),
        bench_cluster(),
    )


async def _deploy(admin: Api, name: str) -> str:
    made = await admin.post(
        "/v2/nvcf/functions", {**LLM_FUNCTION, "name": name, "containerImage": f"llm-{name}", "tags": [f"model={name}"]}
    )
    fid, vid = made.json["function"]["id"], made.json["function"]["versionId"]
    d = f"/v2/nvcf/deployments/functions/{fid}/versions/{vid}"
    spec = {
        "gpu": "H100",
        "instanceType": "ON-PREM.GPU.H100_1x",
        "minInstances": 1,
        "maxInstances": 1,
        "maxRequestConcurrency": 256,
    }
    await admin.post(d, {"deploymentSpecifications": [spec]})
    await wait_status(admin, d, "ACTIVE", timeout=60)
    return str(fid)


def _port_of(roles: dict[int, str], model: str) -> int:
    for pid, role in roles.items():
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode() for a in f.read().split(b"\0")]
        if role == "function" and "nvcf_mono.examples.llm" in argv and model in argv:
            return int(argv[argv.index("--port") + 1])
    raise RuntimeError(f"no server of model {model} among the platform's processes")


async def _stream(
    session: aiohttp.ClientSession, url: str, headers: dict[str, str], model: str
) -> tuple[float, list[float]]:
    """Time to the first content token, and the times between the following ones."""
    body = {"model": model, "messages": [{"role": "user", "content": "bench"}], "max_tokens": TOKENS, "stream": True}
    started = time.perf_counter()
    stamps: list[float] = []
    async with session.post(url, json=body, headers=headers) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{url} answered {resp.status}: {await resp.text()}")
        async for line in resp.content:
            if line.startswith(b"data: {") and b'"content":"' in line and b'"content":""' not in line:
                stamps.append(time.perf_counter())
    if len(stamps) != TOKENS:
        raise RuntimeError(f"{len(stamps)} tokens arrived of {TOKENS}")
    return stamps[0] - started, [b - a for a, b in itertools.pairwise(stamps)]


async def _round(
    session: aiohttp.ClientSession, url: str, headers: dict[str, str], model: str, clients: int
) -> tuple[list[float], list[float], float]:
    ttft: list[float] = []
    gaps: list[float] = []
    started = time.perf_counter()

    async def one() -> None:
        first, between = await _stream(session, url, headers, model)
        ttft.append(first)
        gaps.append(statistics.fmean(between))

    async with anyio.create_task_group() as tg:
        for _ in range(clients):
            tg.start_soon(one)
    return ttft, gaps, clients * TOKENS / (time.perf_counter() - started)


async def compare(
    session: aiohttp.ClientSession, urls: dict[str, str], key: dict[str, str], model: str, *, clients: int, rounds: int
) -> dict[str, Any]:
    """Alternating rounds direct and through the gateway: TTFT and inter-token p50, tokens per second."""
    got: dict[str, tuple[list[float], list[float], list[float]]] = {k: ([], [], []) for k in urls}
    for _ in range(rounds):
        for name, url in urls.items():
            ttft, gaps, rate = await _round(session, url, {} if name == "direct" else key, model, clients)
            got[name][0].extend(ttft)
            got[name][1].extend(gaps)
            got[name][2].append(rate)
    out: dict[str, Any] = {}
    for name, (ttft, gaps, rates) in got.items():
        out[name] = {
            "ttft_p50_ms": _quantile(ttft, 0.5) * 1000,
            "ttft_p99_ms": _quantile(ttft, 0.99) * 1000,
            "itl_p50_ms": _quantile(gaps, 0.5) * 1000,
            "tokens_per_s": statistics.fmean(rates),
        }
    return out


async def run(quick: bool = False) -> dict[str, Any]:
    rounds = 3 if quick else 10
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="nvcf-bench-llm-") as tmp:
        async with (
            platform_process(Path(tmp) / "state", *_settings(), compute=True) as ep,
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session,
        ):
            admin = Api(session, ep["api_url"], ep["credentials"]["admin_token"], timeout=60)
            key = {"Authorization": f"Bearer {ep['credentials']['api_key']}"}
            fids = {name: await _deploy(admin, name) for name in ("paced", "fast")}
            roles = _processes(int(ep["pid"]))
            gateway = f"{ep['api_url']}/v1/chat/completions"
            for model, levels in (("paced", (1, 8, 32)), ("fast", (16, 64))):
                urls = {
                    "direct": f"http://127.0.0.1:{_port_of(roles, model)}/v1/chat/completions",
                    # The same call as a plain pexec: what the gateway adds to the invocation path itself.
                    "pexec": f"{ep['api_url']}/v2/nvcf/pexec/functions/{fids[model]}",
                    "gateway": gateway,
                }
                await compare(session, urls, key, model, clients=4, rounds=1)  # warm up
                for clients in levels:
                    meter = CpuMeter(roles)
                    r = results[f"{model}_{clients}"] = await compare(
                        session, urls, key, model, clients=clients, rounds=rounds
                    )
                    used, _ = meter.read()
                    # Platform, worker and nats-server work only in the pexec and gateway rounds.
                    platform = sum(v for role, v in used.items() if role != "function")
                    r["platform_cpu_ms_per_token"] = platform * 1000 / (2 * rounds * clients * TOKENS)
    report(results)
    return results


def report(results: dict[str, Any]) -> None:
    for name, r in results.items():
        d, x, g = r["direct"], r["pexec"], r["gateway"]
        # At low concurrency the platform's idle work (timers, heartbeats) dominates CPU per token.
        cpu = f" | platform CPU {r['platform_cpu_ms_per_token']:.3f} ms per token" if name.startswith("fast") else ""
        print(
            f"llm {name} streams: TTFT p50 direct {d['ttft_p50_ms']:.2f} gateway {g['ttft_p50_ms']:.2f} ms "
            f"(added {g['ttft_p50_ms'] - d['ttft_p50_ms']:.2f}, by pexec {x['ttft_p50_ms'] - d['ttft_p50_ms']:.2f}; "
            f"p99 {d['ttft_p99_ms']:.1f}/{g['ttft_p99_ms']:.1f}) | "
            f"between tokens p50 direct {d['itl_p50_ms']:.2f} gateway {g['itl_p50_ms']:.2f} ms "
            f"(added {g['itl_p50_ms'] - d['itl_p50_ms']:.2f}) | tokens/s direct {d['tokens_per_s']:.0f} "
            f"gateway {g['tokens_per_s']:.0f} ({g['tokens_per_s'] / d['tokens_per_s']:.2f}x){cpu}"
        )


def main() -> None:
    anyio.run(run, "--quick" in sys.argv, backend="asyncio")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
