"""Cold start from zero on the containers backend (Podman), next to the container's own start.

One all-in-one ``nvcf-mono run`` child process whose cluster runs instances as containers on a
``podman system service`` this benchmark starts (the platform is given its socket), fast autoscaler
timers, and this process as the client. The image is the offline busybox echo image
(``nvcf_mono.testing.container_images``), present locally, so no pull is timed. In one run:

(a) the container's own start: create + start through the same engine API, until its health route
    answers 200 on its published port; then, for a version at zero instances, the time from a
    request to its response. The platform's share is the difference (budget: <= 1 s).
(b) back to zero: from the call to the container being gone, minus the idle timeout.

``python -m bench.container_cold_start [--quick]``; needs podman, runc and busybox-static.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import aiodocker
import aiohttp
import anyio

from bench.cold_start import IDLE_TIMEOUT, TIMERS, healthy_after
from bench.invoke import platform_process
from nvcf_mono.ports import free_port
from nvcf_mono.testing.container_images import ECHO_IMAGE, build_echo_image, write_containers_conf
from nvcf_mono.testing.platform import Api, wait_for

FUNCTION = {
    "inferenceUrl": "/cgi-bin/echo",
    "inferencePort": 9000,
    "containerImage": ECHO_IMAGE,
    "health": {"protocol": "HTTP", "uri": "/health", "port": 9000, "timeout": "PT5S", "expectedStatusCode": 200},
}


def settings(socket: str) -> tuple[str, ...]:
    cluster = {
        "name": "pods",
        "id": str(uuid.uuid4()),
        "backend": "containers",
        "gpu_discovery": "static",
        "gpus": [{"name": "H100", "count": 8}],
        "containers": {"socket": socket},
    }
    return (
        *TIMERS,
        "plugins.compute.clusters=" + json.dumps([cluster]),
    )


async def own_start(docker: aiodocker.Docker, session: aiohttp.ClientSession) -> float:
    """Create and start the image's container through the engine API; seconds until its health route answers."""
    port = free_port("127.0.0.1")
    body = {
        "Image": ECHO_IMAGE,
        "ExposedPorts": {"9000/tcp": {}},
        "HostConfig": {"PortBindings": {"9000/tcp": [{"HostIp": "127.0.0.1", "HostPort": str(port)}]}},
    }
    started = time.perf_counter()
    container = await docker.containers.create(body, name=f"bench-{uuid.uuid4().hex[:8]}")
    try:
        await container.start()
        return await healthy_after(session, port, started)
    finally:
        await container.delete(force=True)


async def run(quick: bool = False) -> dict[str, Any]:
    podman = shutil.which("podman")
    if podman is None:
        raise SystemExit("podman is not installed (apt-get install podman runc busybox-static)")
    rounds = 2 if quick else 5
    with tempfile.TemporaryDirectory(prefix="nvcf-bench-pods-") as tmp:
        if "CONTAINERS_CONF" not in os.environ:
            os.environ["CONTAINERS_CONF"] = str(write_containers_conf(Path(tmp) / "containers.conf"))
        build_echo_image(podman)
        sock = Path(tmp) / "podman.sock"
        service = await anyio.open_process(
            [podman, "system", "service", "--time=0", f"unix://{sock}"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            await wait_for(lambda: anyio.Path(sock).exists(), timeout=20, what="podman's socket")
            async with (
                aiodocker.Docker(url=f"unix://{sock}") as docker,
                platform_process(Path(tmp) / "state", *settings(str(sock)), compute=True) as ep,
                aiohttp.ClientSession() as session,
            ):
                admin = Api(session, ep["api_url"], ep["credentials"]["admin_token"], timeout=60)
                key = Api(session, ep["invocation_url"], ep["credentials"]["api_key"], timeout=60)
                own = [await own_start(docker, session) for _ in range(rounds)]

                fn = (await admin.post("/v2/nvcf/functions", {**FUNCTION, "name": "cold-pod"})).json["function"]
                path = f"/v2/nvcf/deployments/functions/{fn['id']}/versions/{fn['versionId']}"
                spec = {"gpu": "H100", "instanceType": "ON-PREM.GPU.H100_1x", "minInstances": 0, "maxInstances": 1}
                assert (await admin.post(path, {"deploymentSpecifications": [spec]})).status == 200

                async def active() -> bool:
                    return (await admin.get(path)).json["deployment"]["functionStatus"] == "ACTIVE"

                await wait_for(active, timeout=60, what="ACTIVE")
                cold, to_zero = [], []
                for i in range(rounds):
                    started = time.perf_counter()
                    reply = await key.post(f"/v2/nvcf/pexec/functions/{fn['id']}", {"round": i})
                    cold.append(time.perf_counter() - started)
                    assert reply.status == 200 and reply.json["echo"] == {"round": i}, reply.body

                    async def gone() -> bool:
                        found = await docker.containers.list(all=True, filters=json.dumps({"name": ["nvcf-"]}))
                        return not found

                    await wait_for(gone, timeout=IDLE_TIMEOUT + 60, what="the container to be removed")
                    to_zero.append(time.perf_counter() - started - IDLE_TIMEOUT)
                    await anyio.sleep(0.5)
        finally:
            service.terminate()
            with anyio.move_on_after(10, shield=True):
                await service.wait()
    own_p50, cold_p50 = statistics.median(own), statistics.median(cold)
    figures = {
        "container_start_p50_s": own_p50,
        "cold_start_p50_s": cold_p50,
        "cold_start_max_s": max(cold),
        "platform_share_p50_s": cold_p50 - own_p50,
        "idle_to_zero_after_timeout_p50_s": statistics.median(to_zero),
    }
    print(f"container's own start through the engine API (p50 of {rounds}): {own_p50 * 1000:.0f} ms")
    print(
        f"(a) request at zero -> response: p50 {cold_p50 * 1000:.0f} ms, max {max(cold) * 1000:.0f} ms; "
        f"platform's share p50 {figures['platform_share_p50_s'] * 1000:.0f} ms (budget <= 1000 ms)"
    )
    print(
        f"(b) idle -> zero: container removed p50 {figures['idle_to_zero_after_timeout_p50_s'] * 1000:.0f} ms after "
        f"the {IDLE_TIMEOUT:g} s idle timeout (counted from the call)"
    )
    return figures


def main() -> None:
    anyio.run(run, "--quick" in sys.argv[1:], backend="asyncio")


if __name__ == "__main__":
    main()
