"""The containers backend for real: function images on Podman, invoked through the platform.

The images are built offline (``images.py``); the backend starts ``podman system service`` itself.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import socket
import ssl
import subprocess
import urllib.request
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from nvcf_mono.auth import scopes
from nvcf_mono.helm.model import RegistryCredential
from nvcf_mono.planes.compute.backends.containers import image_pull
from nvcf_mono.planes.compute.backends.containers.engine import open_engine
from nvcf_mono.planes.compute.config import ContainerSettings
from nvcf_mono.testing.container_images import ECHO_IMAGE, ECHO_USER_IMAGE, private_registry
from nvcf_mono.testing.platform import Api, deployment, wait_for, wait_status
from nvcf_mono.testing.running import LLM_FUNCTION, other_account_key
from nvcf_mono.tls import development_certificate
from tests.integration.compute.conftest import (
    Platform,
    cluster,
    cluster_pids,
    compute_platform,
    create,
    deploy,
    instances,
    running,
    spec,
)
from tests.integration.compute.test_autoscaling import AUTOSCALE, placed, placement
from tests.integration.compute.test_tasks_local import finished, get_task, launch
from tests.integration.invocation.test_llm_gateway import (
    chat_completions_embeddings_and_responses,
    client,
    streamed_chat,
)
from tests.support.leftovers import kill

from .conftest import containers_of

# One xdist worker runs them all: they share the engine's image store and test images.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("containers")]

TASK_SETTINGS = {
    "plugins.control.tasks.monitor_interval": "0.3",
    "plugins.control.tasks.heartbeat_interval": "0.5",
}


def image_function(name: str, url: str = "/cgi-bin/echo", **more: Any) -> dict[str, Any]:
    return {
        "name": name,
        "inferenceUrl": url,
        "inferencePort": 9000,
        "containerImage": ECHO_IMAGE,
        "health": {"protocol": "HTTP", "uri": "/health", "port": 9000, "timeout": "PT5S", "expectedStatusCode": 200},
        **more,
    }


@asynccontextmanager
async def container_platform(
    tmp_path: Path,
    cluster_id: str,
    podman: str,
    containers: dict[str, Any] | None = None,
    gpus: int = 4,
    **settings: str,
) -> AsyncIterator[Platform]:
    """The platform with one cluster of ``gpus`` on the containers backend (``containers``: its backend settings);
    whatever of the cluster a failed test left running (a host that ends on an error leaves its instances
    for the next agent) is removed at the end.
    """
    chosen = [cluster("pods", cluster_id, count=gpus, backend="containers", containers=containers or {})]
    try:
        async with compute_platform(tmp_path, clusters=chosen, **settings) as p:
            yield p
    finally:
        remove_leftovers(podman, cluster_id)


def remove_leftovers(podman: str, cluster_id: str) -> None:
    kill(cluster_pids(cluster_id))
    for name in containers_of(podman, cluster_id):
        subprocess.run([podman, "rm", "-f", "-t", "0", name], capture_output=True, check=False)


async def test_an_image_serves_requests_sees_its_secrets_and_nothing_of_the_host(tmp_path: Path, podman: str) -> None:
    cluster_id = str(uuid.uuid4())
    async with container_platform(tmp_path, cluster_id, podman) as p:
        secret_path = tmp_path / "state" / "platform-secret"
        body = image_function(
            "echo-image",
            containerEnvironment=[
                {"key": "GREETING", "value": "hi"},
                {"key": "PROBE_PATH", "value": str(secret_path)},
            ],
            secrets=[{"name": "api-key", "value": "s3cret"}],
        )
        fid, _, d = await create(p.admin, body)
        sse_fid, _, sse_d = await create(p.admin, image_function("sse-image", "/cgi-bin/stream"))
        await deploy(p.admin, d, spec())
        await deploy(p.admin, sse_d, spec())
        await wait_status(p.admin, d, "ACTIVE", timeout=60)

        reply = await p.key.post(f"/v2/nvcf/pexec/functions/{fid}", {"message": "hello"})
        assert reply.status == 200, reply.body
        seen = reply.json
        (view,) = [v for v in await running(p.bus, cluster_id, 2, timeout=60) if v.function_id == fid]
        assert seen["echo"] == {"message": "hello"}
        assert seen["secrets"] == {"api-key": "s3cret"}  # /var/secrets/secrets.json, read-only
        assert seen["instance"] == view.instance.instance_id and seen["function"] == fid
        assert seen["port"] == "9000"  # its own inferencePort, in a network namespace of its own
        assert seen["greeting"] == "hi" and seen["image_env"] == "from-the-image"
        assert secret_path.exists() and "No such file" in seen["probe"], seen["probe"]
        assert seen["token"] == "none"  # the worker's token stays with the worker

        names = containers_of(podman, cluster_id)
        assert f"nvcf-{view.instance.instance_id}" in names and len(names) == 2

        await wait_status(p.admin, sse_d, "ACTIVE", timeout=60)
        streamed = await p.key.post(f"/v2/nvcf/pexec/functions/{sse_fid}", {}, headers={"Accept": "text/event-stream"})
        assert streamed.status == 200, streamed.body
        assert streamed.headers["Content-Type"].startswith("text/event-stream")
        text = streamed.body.decode()
        assert [line for line in text.splitlines() if line.startswith("data:")] == [
            "data: event 1",
            "data: event 2",
            "data: event 3",
        ]

        logs = await p.admin.get(f"/v2/nvcf/instances/{view.instance.instance_id}/logs")
        assert logs.status == 200, logs.body
        assert {log["name"] for log in logs.json["logs"]} == {"inference", "worker"}

        assert (await p.admin.delete(d)).status == 200
        assert (await p.admin.delete(sse_d)).status == 200

        async def removed() -> bool:
            return containers_of(podman, cluster_id) == [] and cluster_pids(cluster_id) == []

        await wait_for(removed, timeout=60, what="the containers and their workers to be gone")


async def test_a_crashing_image_is_a_restart_loop(tmp_path: Path, podman: str) -> None:
    cluster_id = str(uuid.uuid4())
    async with container_platform(tmp_path, cluster_id, podman) as p:
        body = image_function("crashy-image", containerArgs="/bin/sh -c 'echo giving up; exit 3'")
        _, _, d = await create(p.admin, body)
        await deploy(p.admin, d, spec())

        seen: list[Any] = []

        async def looping() -> list[Any] | None:
            held = seen[:] = await instances(p.bus, cluster_id, finished=True)
            failed = [v for v in held if v.instance.state == "container-restart-loop"]
            return failed or None

        try:
            (failed, *_) = await wait_for(looping, timeout=60, what="a restart loop")
        except AssertionError as err:  # what the agent saw, and the instance's log, to tell why
            logs = [(await p.admin.get(f"/v2/nvcf/instances/{v.instance.instance_id}/logs")).body for v in seen]
            raise AssertionError(f"{err}\ninstances: {seen!r}\nlogs: {logs!r}"[-6000:]) from None
        assert failed.instance.restarts >= 3
        dep = await deployment(p.admin, d)
        last = dep["deploymentSpecifications"][0]["placement"]["lastFailure"]
        assert "container-restart-loop" in last and "exited with code 3" in last, last

        # Its log is the container's output, each run after a banner, kept after the container is gone.
        async def three_runs() -> tuple[str, list[str]] | None:
            logs = await p.admin.get(f"/v2/nvcf/instances/{failed.instance.instance_id}/logs")
            assert logs.status == 200, logs.body
            text = next(log["text"] for log in logs.json["logs"] if log["name"] == "inference")
            runs = text.split("nvcf-mono: starting the inference server")[1:]
            # The loop goes on while the log is read: its last run may have its banner and no output yet
            # (and the restart count can be ahead of the output copied so far).
            finished = runs if runs and "giving up" in runs[-1] else runs[:-1]
            return (text, finished) if len(finished) >= 3 else None

        text, finished = await wait_for(three_runs, timeout=20, what="three finished runs in the log")
        assert all("giving up" in run for run in finished), text
        assert text.count("giving up") == len(finished), text  # each line once


async def test_a_restart_the_engine_refuses_is_a_failed_run(tmp_path: Path, podman: str) -> None:
    """A start that fails after the container has run (here its published port is taken between two runs)
    is a run that ended, which the restart loop counts, the engine's words in the instance's log; not an
    error that ends the instance at once. (Podman 4.3 also fails starts of containers that exit at once.)"""
    cluster_id = str(uuid.uuid4())
    async with container_platform(tmp_path, cluster_id, podman) as p:
        body = image_function("port-taken", containerArgs="/bin/sh -c 'echo up; sleep 2; exit 3'")
        _, _, d = await create(p.admin, body)
        await deploy(p.admin, d, spec())

        async def started() -> Any:
            held = await instances(p.bus, cluster_id)
            return next((v for v in held if any(x.role == "inference" for x in v.instance.processes)), None)

        view = await wait_for(started, timeout=60, what="the container to run")
        with socket.socket() as holder:

            async def taken() -> bool:  # the engine holds the port while the container runs
                try:
                    holder.bind(("127.0.0.1", view.instance.port))
                except OSError:
                    return False
                holder.listen()
                return True

            await wait_for(taken, timeout=60, interval=0.01, what="the container's port between two runs")

            async def looping() -> Any:
                held = await instances(p.bus, cluster_id, finished=True)
                return next((v for v in held if v.instance.state == "container-restart-loop"), None)

            failed = await wait_for(looping, timeout=90, what="a restart loop")
        assert failed.instance.instance_id == view.instance.instance_id and failed.instance.restarts >= 3
        logs = await p.admin.get(f"/v2/nvcf/instances/{failed.instance.instance_id}/logs")
        assert logs.status == 200, logs.body
        text = next(log["text"] for log in logs.json["logs"] if log["name"] == "inference")
        assert "the container engine says its start failed: " in text, text
        said = "the inference server could not be started again: "
        assert said in failed.instance.error_log and "in use" in failed.instance.error_log, failed.instance.error_log


async def test_a_version_at_zero_wakes_in_a_container_and_goes_back(tmp_path: Path, podman: str) -> None:
    cluster_id = str(uuid.uuid4())
    async with container_platform(tmp_path, cluster_id, podman, **AUTOSCALE) as p:
        fid, _, d = await create(p.admin, image_function("cold-image"))
        await deploy(p.admin, d, spec(min_instances=0, max_instances=1))
        await wait_status(p.admin, d, "ACTIVE")
        assert containers_of(podman, cluster_id) == []
        reply = await p.key.post(f"/v2/nvcf/pexec/functions/{fid}", {"n": 1}, headers={"NVCF-POLL-SECONDS": "60"})
        assert reply.status == 200, reply.body
        assert reply.json["echo"] == {"n": 1}
        p0 = await placed(p.admin, d, 0, timeout=40)
        assert "scale to zero" in (p0.get("autoscaler") or ""), p0

        async def removed() -> bool:
            return containers_of(podman, cluster_id) == []

        await wait_for(removed, timeout=30, what="the container to be removed")
        assert placement(await deployment(p.admin, d))["placedInstances"] == 0


def task_body(name: str, script: str, **more: Any) -> dict[str, Any]:
    return {
        "name": name,
        "containerImage": ECHO_IMAGE,
        "containerArgs": f"/bin/sh -c '{script}'",
        "gpuSpecification": {"gpu": "H100", "instanceType": "ON-PREM.GPU.H100_1x"},
        **more,
    }


async def test_a_task_writes_results_and_one_past_its_deadline_is_stopped(tmp_path: Path, podman: str) -> None:
    cluster_id = str(uuid.uuid4())
    async with container_platform(tmp_path, cluster_id, podman, **TASK_SETTINGS) as p:
        script = (
            'echo "{\\"percentComplete\\": 50}" > $NVCT_PROGRESS_FILE_PATH; sleep 1; '
            'echo "made by $NVCT_TASK_ID" > $NVCT_RESULTS_DIR/out.txt; '
            'echo "{\\"percentComplete\\": 100}" > $NVCT_PROGRESS_FILE_PATH'
        )
        done = await launch(p.admin, task_body("results", script))
        late = await launch(p.admin, task_body("late", "sleep 600", maxRuntimeDuration="PT3S"))
        task = await finished(p.admin, done, timeout=90)
        assert task["status"] == "COMPLETED", task
        results = (await p.admin.get(f"/v1/nvct/tasks/{done}/results")).json["results"]
        assert [r["name"] for r in results] == ["out.txt"]
        content = await p.admin.get(f"/v1/nvct/tasks/{done}/results/{results[0]['resultId']}/content")
        assert content.body == f"made by {done}\n".encode()

        task = await finished(p.admin, late, timeout=90)
        assert task["status"] == "EXCEEDED_MAX_RUNTIME_DURATION", task
        assert (await get_task(p.admin, late))["status"] == "EXCEEDED_MAX_RUNTIME_DURATION"


def container_ids(podman: str, name: str) -> list[str]:
    """The ids of the running containers called ``name`` (podman failing fails the test, not an empty list)."""
    return subprocess.run(
        [podman, "ps", "-q", "--no-trunc", "--filter", f"name={name}"], capture_output=True, text=True, check=True
    ).stdout.split()


async def test_the_next_agent_takes_the_running_container_over(tmp_path: Path, podman: str) -> None:
    cluster_id = str(uuid.uuid4())
    chosen = [
        cluster("pods", cluster_id, count=4, backend="containers", containers={"stop_instances_on_shutdown": False})
    ]
    try:
        async with compute_platform(tmp_path, clusters=chosen) as p:
            fid, _, d = await create(p.admin, image_function("kept-image"))
            await deploy(p.admin, d, spec())
            await wait_status(p.admin, d, "ACTIVE", timeout=60)
            (before,) = await running(p.bus, cluster_id, timeout=60)
        names = containers_of(podman, cluster_id)
        assert names == [f"nvcf-{before.instance.instance_id}"]
        running_ids = container_ids(podman, names[0])
        assert running_ids, "the container kept running while no agent watched it"

        async with compute_platform(tmp_path, clusters=chosen) as p:
            (after,) = await running(p.bus, cluster_id, timeout=60)
            assert after.instance.instance_id == before.instance.instance_id
            assert after.instance.restarts == 0
            reply = await p.key.post(f"/v2/nvcf/pexec/functions/{fid}", {"again": True})
            assert reply.status == 200 and reply.json["echo"] == {"again": True}, reply.body
            still = container_ids(podman, names[0])
            assert still == running_ids  # the same container, not a new one
            assert (await p.admin.delete(d)).status == 200

            async def removed() -> bool:
                return containers_of(podman, cluster_id) == []

            await wait_for(removed, timeout=60, what="the container to be removed")
    finally:
        remove_leftovers(podman, cluster_id)


async def _store_logins(api: Api, logins: list[tuple[str, str]]) -> None:
    """The account's registry credentials: (registry host, password) for user alice."""
    for hostname, password in logins:
        secret = base64.b64encode(f"alice:{password}".encode()).decode()
        stored = await api.post(
            "/v2/nvcf/registry-credentials",
            {
                "registryHostname": hostname,
                "secret": {"name": f"login-{password}", "value": secret},
                "artifactTypes": ["CONTAINER"],
            },
        )
        assert stored.status == 200, stored.body


def _registry_get(host: str, path: str, ca: Path) -> bytes:
    """``/v2/nvcf-test/private/<path>`` from the test registry, as alice (manifests in either format)."""
    kinds = ("application/vnd.docker.distribution.manifest.v2+json", "application/vnd.oci.image.manifest.v1+json")
    request = urllib.request.Request(
        f"https://{host}/v2/nvcf-test/private/{path}",
        headers={
            "Accept": ", ".join(kinds),
            "Authorization": "Basic " + base64.b64encode(b"alice:wonderland").decode(),
        },
    )
    with urllib.request.urlopen(request, context=ssl.create_default_context(cafile=str(ca)), timeout=10) as got:
        return bytes(got.read())


def _manifest_digest(host: str, tag: str, ca: Path) -> str:
    """The digest of a manifest in the test registry (as ``docker push`` prints it)."""
    return "sha256:" + hashlib.sha256(_registry_get(host, f"manifests/{tag}", ca)).hexdigest()


def _layers(host: str, tag: str, ca: Path) -> list[str]:
    """The digests of a tag's layers, as the registry stores them."""
    return [layer["digest"] for layer in json.loads(_registry_get(host, f"manifests/{tag}", ca))["layers"]]


def _diff_ids(host: str, tag: str, ca: Path) -> list[str]:
    """A tag's layers' diff IDs, as its config gives them."""
    config = json.loads(_registry_get(host, f"manifests/{tag}", ca))["config"]["digest"]
    return list(json.loads(_registry_get(host, f"blobs/{config}", ca))["rootfs"]["diff_ids"])


def _reads(log: str, digest: str) -> int:
    """How often the registry sent the blob ``digest`` (its access log's lines)."""
    return log.count(f'"GET /v2/nvcf-test/private/blobs/{digest} HTTP/1.1" 200')


async def _settled(log: Path) -> str:
    """The log once it has not grown for a second (the registry logs a request after answering it)."""
    text, still = await anyio.Path(log).read_text(), 0
    for _ in range(100):
        await anyio.sleep(0.2)
        now = await anyio.Path(log).read_text()
        still = still + 1 if now == text else 0
        text = now
        if still >= 5:
            break
    return text


def _has_image(podman: str, name: str) -> bool:
    return subprocess.run([podman, "image", "exists", name], capture_output=True, check=False).returncode == 0


async def test_the_platform_pulls_a_private_image_with_the_accounts_credentials_and_the_engine_loads_it(
    tmp_path: Path, podman: str
) -> None:
    cluster_id = str(uuid.uuid4())
    tls = development_certificate(tmp_path / "tls", ["localhost", "127.0.0.1"])
    assert tls.ca is not None
    containers = {"registry_ca_file": str(tls.ca), "registry_networks": ["127.0.0.1/32", "::1/128"]}
    with private_registry(podman, tmp_path / "registry", tls=(tls.cert, tls.key)) as host:
        port = host.rsplit(":", 1)[1]
        log = tmp_path / "registry" / "registry.log"
        async with container_platform(tmp_path, cluster_id, podman, containers, gpus=8) as p:
            # The same registry by two names: the account's login for one is right, for the other wrong.
            await _store_logins(p.admin, [(host, "wonderland"), (f"localhost:{port}", "not-the-password")])

            # Tag 1 has OCI's manifest; tag 2, Docker's, is asked for by its digest.
            digest = _manifest_digest(host, "2", tls.ca)
            for name, image in (
                ("oci", f"{host}/nvcf-test/private:1"),
                ("docker", f"{host}/nvcf-test/private@{digest}"),
            ):
                fid, _, d = await create(p.admin, image_function(f"private-{name}", containerImage=image))
                await deploy(p.admin, d, spec())
                await wait_status(p.admin, d, "ACTIVE", timeout=90)
                reply = await p.key.post(f"/v2/nvcf/pexec/functions/{fid}", {"pulled": name})
                assert reply.status == 200 and reply.json["echo"] == {"pulled": name}, reply.body
            assert _has_image(podman, f"{host}/nvcf-test/private:1")
            assert _has_image(podman, f"{host}/nvcf-test/private:{digest.replace(':', '-')}")
            # The layer was read once: the second image's is the first's, on the host and the account's own.
            [base] = _layers(host, "1", tls.ca)
            served = await _settled(log)
            assert sum(_reads(served, layer) for layer in {base, *_layers(host, "2", tls.ca)}) == 1

            # A new version over the same base: only its own layer is read.
            assert _layers(host, "3", tls.ca)[0] == base
            await serves_its_layers(p.admin, p.key, f"{host}/nvcf-test/private:3", ("added", "added by tag 3"))
            served = await _settled(log)
            assert (_reads(served, base), _reads(served, _layers(host, "3", tls.ca)[1])) == (1, 1)

            _, _, wrong = await create(
                p.admin, image_function("refused", containerImage=f"localhost:{port}/nvcf-test/private:1")
            )
            await deploy(p.admin, wrong, spec())
            dep = await wait_status(p.admin, wrong, "ERROR", timeout=90)
            error = dep["healthInfo"][0]["error"]
            assert "image-pull-issues" in error and "no credential was valid" in error, error
            assert f"localhost:{port}/nvcf-test/private:1" in error, error
            assert not _has_image(podman, f"localhost:{port}/nvcf-test/private:1")

            # Another account naming the image now on the host starts it only once its own login reads it.
            neighbour = p.api(await other_account_key(p, "neighbour", scopes.ACCOUNT_ADMIN_SCOPES))
            private = image_function("borrowed", containerImage=f"{host}/nvcf-test/private:1")
            _, _, borrowed = await create(neighbour, private)
            await deploy(neighbour, borrowed, spec())
            dep = await wait_status(neighbour, borrowed, "ERROR", timeout=90)
            error = dep["healthInfo"][0]["error"]
            assert "image-pull-issues" in error and "no credential was valid" in error, error
            await _store_logins(neighbour, [(host, "wonderland")])
            # Nor does its pull of another image take a layer from the first account's private ones.
            await serves_its_layers(neighbour, neighbour, f"{host}/nvcf-test/private:4", ("other", "added by tag 4"))
            assert _reads(await _settled(log), base) == 2
            fid, _, shown = await create(neighbour, {**private, "name": "shown"})
            await deploy(neighbour, shown, spec())
            await wait_status(neighbour, shown, "ACTIVE", timeout=90)
            reply = await neighbour.post(f"/v2/nvcf/pexec/functions/{fid}", {"shown": True})
            assert reply.status == 200 and reply.json["echo"] == {"shown": True}, reply.body


async def serves_its_layers(admin: Api, caller: Api, image: str, added: tuple[str, str]) -> None:
    """A function of ``image`` deploys and answers (its base layer), and reads the file its top layer adds
    (``added``: its name under /www, and its text).
    """
    env = [{"key": "PROBE_PATH", "value": f"/www/{added[0]}"}]
    fid, _, d = await create(
        admin, image_function(f"layers-{uuid.uuid4().hex[:8]}", containerImage=image, containerEnvironment=env)
    )
    await deploy(admin, d, spec())
    await wait_status(admin, d, "ACTIVE", timeout=90)
    reply = await caller.post(f"/v2/nvcf/pexec/functions/{fid}", {"layers": True})
    assert reply.status == 200 and reply.json["probe"] == added[1], reply.body


async def test_an_archive_without_a_layer_the_engine_lacks_is_pulled_again_whole(
    tmp_path: Path, podman: str, caplog: pytest.LogCaptureFixture
) -> None:
    # As when a layer is removed from the host between the listing of its images and the load.
    tls = development_certificate(tmp_path / "tls", ["localhost", "127.0.0.1"])
    assert tls.ca is not None
    options = image_pull.PullOptions(
        ca_file=tls.ca, networks=("127.0.0.1/32",), networks_setting="registry_networks", max_size=1024**3
    )
    with private_registry(podman, tmp_path / "registry", tls=(tls.cert, tls.key)) as host:
        claimed = set(_diff_ids(host, "3", tls.ca))  # none of which the engine has
        ref = image_pull.parse(f"{host}/nvcf-test/private:3")
        login = [RegistryCredential(username="alice", password="wonderland")]
        async with open_engine(ContainerSettings(), os.environ, tmp_path / "api.sock") as engine:
            with caplog.at_level(logging.INFO):
                pulled = await image_pull.pull_and_load(
                    engine,
                    ref,
                    login,
                    options,
                    archive=tmp_path / "image.tar",
                    on_host=claimed,
                    timeout=120,
                    log=(logging.getLogger("test"), "this pull"),
                )
        assert pulled.reused_layers == 0 and pulled.read_by == login[0]
        assert _has_image(podman, image_pull.local_name(ref))
        said = caplog.text
        assert "this pull: 2 of its layers are on this host already" in said, said
        assert "this pull: the engine did not load it with the layers it has" in said, said
        served = await _settled(tmp_path / "registry" / "registry.log")
        assert [_reads(served, layer) for layer in _layers(host, "3", tls.ca)] == [1, 1]


async def test_an_image_on_an_address_the_operator_did_not_list_is_not_pulled(tmp_path: Path, podman: str) -> None:
    cluster_id = str(uuid.uuid4())
    # A registry on the host's loopback, over plain HTTP: a tenant naming it must not reach it (listing it as
    # plain http does not allow its address).
    with private_registry(podman, tmp_path / "registry") as host:
        served = await _settled(tmp_path / "registry" / "registry.log")  # the push's requests, all logged
        async with container_platform(tmp_path, cluster_id, podman, {"plain_http_registries": [host]}) as p:
            _, _, d = await create(p.admin, image_function("probe", containerImage=f"{host}/nvcf-test/private:1"))
            await deploy(p.admin, d, spec())
            dep = await wait_status(p.admin, d, "ERROR", timeout=90)
            error = dep["healthInfo"][0]["error"]
            assert "image-pull-issues" in error and "127.0.0.1 is a loopback address" in error, error
            assert "containers.registry_networks" in error, error
        assert (tmp_path / "registry" / "registry.log").read_text() == served  # not one request more


async def test_a_registry_the_operator_lists_as_plain_http_is_read_over_http(tmp_path: Path, podman: str) -> None:
    cluster_id = str(uuid.uuid4())
    with private_registry(podman, tmp_path / "registry") as host:
        containers = {"plain_http_registries": [host], "registry_networks": ["127.0.0.1/32"]}
        async with container_platform(tmp_path, cluster_id, podman, containers) as p:
            await _store_logins(p.admin, [(host, "wonderland")])
            fid, _, d = await create(p.admin, image_function("plain", containerImage=f"{host}/nvcf-test/private:1"))
            await deploy(p.admin, d, spec())
            await wait_status(p.admin, d, "ACTIVE", timeout=90)
            reply = await p.key.post(f"/v2/nvcf/pexec/functions/{fid}", {"plain": "http"})
            assert reply.status == 200 and reply.json["echo"] == {"plain": "http"}, reply.body
        served = (tmp_path / "registry" / "registry.log").read_text()
        assert '"GET /v2/nvcf-test/private/manifests/1 HTTP/1.1" 200' in served


async def test_with_engine_pulls_the_engine_pulls_with_the_accounts_credentials(
    tmp_path: Path, podman: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster_id = str(uuid.uuid4())
    monkeypatch.setenv("CONTAINERS_REGISTRIES_CONF", str(tmp_path / "registry" / "registries.conf"))
    with private_registry(podman, tmp_path / "registry") as host:
        port = host.rsplit(":", 1)[1]
        async with container_platform(tmp_path, cluster_id, podman, {"image_pulls": "engine"}) as p:
            await _store_logins(p.admin, [(host, "wonderland"), (f"localhost:{port}", "not-the-password")])
            fid, _, d = await create(p.admin, image_function("private", containerImage=f"{host}/nvcf-test/private:1"))
            await deploy(p.admin, d, spec())
            await wait_status(p.admin, d, "ACTIVE", timeout=90)
            reply = await p.key.post(f"/v2/nvcf/pexec/functions/{fid}", {"pulled": True})
            assert reply.status == 200 and reply.json["echo"] == {"pulled": True}, reply.body

            _, _, wrong = await create(
                p.admin, image_function("refused", containerImage=f"localhost:{port}/nvcf-test/private:1")
            )
            await deploy(p.admin, wrong, spec())
            dep = await wait_status(p.admin, wrong, "ERROR", timeout=90)
            error = dep["healthInfo"][0]["error"]
            assert "image-pull-issues" in error and f"localhost:{port}/nvcf-test/private:1" in error, error


async def test_a_container_left_under_the_instances_name_is_replaced(tmp_path: Path, podman: str) -> None:
    cluster_id = str(uuid.uuid4())
    async with container_platform(tmp_path, cluster_id, podman) as p:
        fid, _, d = await create(p.admin, image_function("squatted"))
        await deploy(p.admin, d, spec())

        async def placed_instance() -> str | None:
            held = await instances(p.bus, cluster_id)
            return held[0].instance.instance_id if held else None

        # Its container removed behind the agent's back, and another (not running) put under its name:
        # the agent counts the exit, then makes its own container again in the other's place.
        iid = await wait_for(placed_instance, timeout=30, what="an instance")
        await wait_status(p.admin, d, "ACTIVE", timeout=60)
        name = f"nvcf-{iid}"
        subprocess.run([podman, "rm", "-f", "-t", "0", name], capture_output=True, check=True)
        squatter = subprocess.run(
            [podman, "create", "--name", name, ECHO_IMAGE], capture_output=True, text=True, check=True
        ).stdout.strip()

        async def replaced() -> bool:
            found = subprocess.run(
                [podman, "ps", "-q", "--no-trunc", "--filter", f"name={name}"], capture_output=True, text=True
            ).stdout.split()
            return bool(found) and found != [squatter]

        await wait_for(replaced, timeout=60, what="the instance's own container to run again")
        reply = await p.key.post(f"/v2/nvcf/pexec/functions/{fid}", {"back": True}, headers={"NVCF-POLL-SECONDS": "60"})
        assert reply.status == 200 and reply.json["echo"] == {"back": True}, reply.body


async def test_an_image_running_as_another_user_reads_its_secrets_and_writes_its_outputs(
    tmp_path: Path, podman: str
) -> None:
    cluster_id = str(uuid.uuid4())
    async with container_platform(
        tmp_path, cluster_id, podman, **{"plugins.compute.local.secrets_refresh": "0.5"}
    ) as p:
        body = image_function(
            "as-a-user", containerImage=ECHO_USER_IMAGE, secrets=[{"name": "api-key", "value": "s3cret"}]
        )
        fid, vid, d = await create(p.admin, body)
        await deploy(p.admin, d, spec())
        await wait_status(p.admin, d, "ACTIVE", timeout=60)
        reply = await p.key.post(f"/v2/nvcf/pexec/functions/{fid}", {"who": "me"})
        assert reply.status == 200, reply.body
        seen = reply.json
        assert seen["uid"] == "1000" and seen["echo"] == {"who": "me"}
        assert seen["secrets"] == {"api-key": "s3cret"}  # readable to the image's user, still read-only
        assert seen["wrote_output"] == "yes"  # NVCF-LARGE-OUTPUT-DIR is its to write, as a pod's emptyDir

        # Rotated while it runs: the same container reads the new value (the file stays open to its user).
        rotated = {"secrets": [{"name": "api-key", "value": "rotated"}]}
        assert (await p.admin.put(f"/v2/nvcf/secrets/functions/{fid}/versions/{vid}", rotated)).status == 204

        async def rotated_seen() -> bool:
            again = await p.key.post(f"/v2/nvcf/pexec/functions/{fid}", {"who": "me"})
            return bool(again.status == 200 and again.json["secrets"] == {"api-key": "rotated"})

        await wait_for(rotated_seen, timeout=20, what="the rotated secret read by the image's user")


async def test_the_example_model_in_its_image_answers_openai_clients_through_the_gateway(
    tmp_path: Path, podman: str, llm_image: str
) -> None:
    """The LLM example as a container image (made of this machine's Python: no base image can be pulled
    here), on the containers backend, called with OpenAI's client through the gateway.
    """
    cluster_id = str(uuid.uuid4())
    async with container_platform(tmp_path, cluster_id, podman) as p:
        fid, _, d = await create(p.admin, {**LLM_FUNCTION, "containerImage": llm_image})
        await deploy(p.admin, d, spec())
        await wait_status(p.admin, d, "ACTIVE", timeout=90)
        (view,) = await running(p.bus, cluster_id, 1, timeout=60)
        assert containers_of(podman, cluster_id) == [f"nvcf-{view.instance.instance_id}"]
        async with client(p.key) as llm:
            await chat_completions_embeddings_and_responses(llm, fid)
            stamps, usage = await streamed_chat(llm)
            assert len(stamps) == 40 and usage is not None and usage.completion_tokens == 40
            chat = await llm.chat.completions.create(
                model="tiny-llm", messages=[{"role": "user", "content": "where?"}], max_tokens=1
            )
        assert chat.system_fingerprint == f"fp_{view.instance.instance_id}"  # the model in the container answered
        assert (await p.admin.delete(d)).status == 200

        async def removed() -> bool:
            return containers_of(podman, cluster_id) == [] and cluster_pids(cluster_id) == []

        await wait_for(removed, timeout=60, what="the container and its worker to be gone")
