"""What reading and writing the data models costs (``python -m bench.models``).

Three models the platform reads and writes all the time: a stored function version (every key-value
read of the catalog, every entry of a function list), a deployment request body, and the agent's
instance report on the bus. For each: reading it with the walker (``structure``, the config front
end, which names every problem) against ``structure_json`` (the code cattrs generates per class,
the walker only for what it refuses), and writing it back with the walker against ``unstructure``.
Then, through ``nvcf-mono run``, the control API's list of the account's functions at 400 versions.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import anyio

from bench.invoke import platform_process
from nvcf_mono.contracts.agent import AgentInstance
from nvcf_mono.models.common import KeyValue
from nvcf_mono.models.deployment import DeploymentRequest
from nvcf_mono.models.function import FunctionStatus, FunctionVersion, Health, HealthProtocol
from nvcf_mono.structure import _unstructure, structure, structure_json, unstructure
from nvcf_mono.testing.platform import Api
from nvcf_mono.testing.running import ECHO_FUNCTION

VERSIONS = 400
FUNCTIONS = 40  # the account's default limit is 50 functions: the rest are versions of these


def samples() -> dict[str, tuple[type, Any]]:
    version = FunctionVersion(
        id="4c5e8d2e-0f63-4f7e-9a51-0b0d1c7f6a11",
        nca_id="nvidia-account",
        version_id="a3f1c9e0-5b7d-4c2a-8e61-2f9d3b4c5a6e",
        name="echo",
        status=FunctionStatus.ACTIVE,
        created_at="2026-12-07T10:00:00.000Z",
        inference_url="/echo",
        inference_port=9000,
        container_image="nvcr.io/org/echo:1.0",
        container_environment=tuple(KeyValue(key=f"K{i}", value="v") for i in range(4)),
        health=Health(protocol=HealthProtocol.HTTP, uri="/health", port=9000, timeout="PT5S", expected_status_code=200),
        description="an echo",
        tags=("a", "b"),
    )
    deployment = {
        "deploymentSpecifications": [
            {
                "gpu": "H100",
                "instanceType": "DGX-H100",
                "minInstances": 0,
                "maxInstances": 4,
                "maxRequestConcurrency": 8,
            }
        ]
    }
    instance = {
        "instanceId": "i-1",
        "createdAt": version.created_at,
        "updatedAt": version.created_at,
        "state": "RUNNING",
        "port": 9000,
        "devices": [0, 1],
        "processes": [],
        "launchedAt": version.created_at,
        "readyAt": version.created_at,
    }
    return {
        "stored function version": (FunctionVersion, unstructure(version)),
        "deployment request body": (DeploymentRequest, deployment),
        "agent instance": (AgentInstance, instance),
    }


def _us(call: Callable[[], Any], n: int) -> float:
    return min(timeit.repeat(call, number=n, repeat=3)) / n * 1e6


def micro(quick: bool) -> None:
    n = 300 if quick else 3000
    for name, (tp, data) in samples().items():
        print(f"models {name}: {_compare(tp, data, n)}")


def _compare(tp: type, data: Any, n: int) -> str:
    value: Any = structure_json(tp, data)
    assert structure(tp, data, forbid_extra=False) == value
    read = (_us(lambda: structure(tp, data, forbid_extra=False), n), _us(lambda: structure_json(tp, data), n))
    written = (
        _us(lambda: _unstructure(value, redact=False, omit_none=True), n),
        _us(lambda: unstructure(value, omit_none=True), n),
    )
    return (
        f"read {read[0]:.1f} us with the walker, {read[1]:.1f} us generated ({read[0] / read[1]:.1f}x) | "
        f"written {written[0]:.1f} us with the walker, {written[1]:.1f} us generated ({written[0] / written[1]:.1f}x)"
    )


async def listing(quick: bool) -> None:
    versions = 100 if quick else VERSIONS
    settings = ("plugins.control.example_function=false",)
    with tempfile.TemporaryDirectory(prefix="nvcf-bench-models-") as tmp:
        async with (
            platform_process(Path(tmp) / "state", *settings) as ep,
            aiohttp.ClientSession() as session,
        ):
            api = Api(session, ep["api_url"], ep["credentials"]["admin_token"], timeout=60)
            created: list[float] = []
            functions: list[str] = []
            for i in range(versions):
                path = (
                    "/v2/nvcf/functions" if i < FUNCTIONS else f"/v2/nvcf/functions/{functions[i % FUNCTIONS]}/versions"
                )
                body = {**ECHO_FUNCTION, "name": f"echo-{i % FUNCTIONS}", "description": "d" * 40, "tags": ["a", "b"]}
                started = time.perf_counter()
                reply = await api.post(path, body)
                created.append((time.perf_counter() - started) * 1000)
                assert reply.status == 200, reply.detail
                if i < FUNCTIONS:
                    functions.append(reply.json["function"]["id"])
            listed: list[float] = []
            for _ in range(20):
                started = time.perf_counter()
                reply = await api.get("/v2/nvcf/functions")
                listed.append((time.perf_counter() - started) * 1000)
                assert reply.status == 200 and len(reply.json["functions"]) == versions
            print(
                f"models control API, {versions} versions: create p50 {statistics.median(created):.2f} ms | "
                f"list all p50 {statistics.median(listed):.2f} ms"
            )


async def run(quick: bool = False) -> None:
    micro(quick)
    await listing(quick)


if __name__ == "__main__":
    anyio.run(run, "--quick" in sys.argv, backend="asyncio")
