"""The local backend's image catalog and instance environments (the contract of contracts/env.py)."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import attrs
import pytest

from nvcf_mono.contracts import env, states
from nvcf_mono.contracts.messages import Action, CreationMessage, LaunchSpecification
from nvcf_mono.planes.compute.backends.local import LocalBackend
from nvcf_mono.planes.compute.backends.local.environment import (
    Where,
    host_environment,
    inference_environment,
    worker_environment,
)
from nvcf_mono.planes.compute.backends.local.images import LaunchError, candidates, lookup, resolve
from nvcf_mono.planes.compute.config import HealthSettings, Image, LocalSettings, image_catalog
from nvcf_mono.structure import evolve

CATALOG = image_catalog(
    {
        "acme/chat:2": Image(command=("{python}", "-m", "llm", "--port", "{port}"), env={"HOME_DIR": "{instance_dir}"}),
        "fixed": Image(command=("{python}", "-m", "fixed"), port=9000),
        "broken": Image(command=("/nonexistent/server",)),
        "empty": Image(),
        "elsewhere": Image(command=("{python}",), cwd=Path("/nonexistent/dir")),
        "missing": Image(command=("no-such-command-anywhere",)),
    }
)


def test_image_references_are_matched_from_specific_to_general() -> None:
    assert candidates("nvcr.io/acme/echo:1.2") == [
        "nvcr.io/acme/echo:1.2",
        "acme/echo:1.2",
        "echo:1.2",
        "nvcr.io/acme/echo",
        "acme/echo",
        "echo",
    ]
    assert lookup(CATALOG, "registry.example.com/echo:1") == ("echo", CATALOG["echo"])
    assert lookup(CATALOG, "nvcr.io/acme/chat:2") == ("acme/chat:2", CATALOG["acme/chat:2"])
    assert lookup(CATALOG, "nvcr.io/acme/chat:3") is None


def _resolve(image: str, args: str = "", tmp: Path = Path("/tmp")):  # type: ignore[no-untyped-def]
    return resolve(CATALOG, image, args, port=4321, python=sys.executable, instance_dir=tmp, path="/usr/bin:/bin")


def test_placeholders_arguments_and_fixed_ports(tmp_path: Path) -> None:
    command = _resolve("acme/chat:2", "--model 'my model' --n 2", tmp_path)
    assert command.argv == (sys.executable, "-m", "llm", "--port", "4321", "--model", "my model", "--n", "2")
    assert command.cwd == tmp_path and command.env == {"HOME_DIR": str(tmp_path)} and command.fixed_port is None
    assert _resolve("fixed", tmp=tmp_path).fixed_port == 9000


@pytest.mark.parametrize(
    ("image", "cause", "words"),
    [
        ("nope:1", states.IMAGE_PULL_ISSUES, "is not in this cluster's image catalog"),
        ("broken", states.IMAGE_PULL_ISSUES, "'/nonexistent/server' does not exist"),
        ("missing", states.IMAGE_PULL_ISSUES, "was not found on PATH"),
        ("empty", states.CREATE_CONTAINER_ERROR, "has no command"),
        ("elsewhere", states.CREATE_CONTAINER_ERROR, "working directory /nonexistent/dir does not exist"),
    ],
)
def test_images_that_cannot_run_say_why(image: str, cause: str, words: str, tmp_path: Path) -> None:
    with pytest.raises(LaunchError) as err:
        _resolve(image, tmp=tmp_path)
    assert err.value.failure.cause == cause and words in err.value.failure.detail


def test_unsplittable_arguments_are_refused(tmp_path: Path) -> None:
    with pytest.raises(LaunchError, match="containerArgs cannot be split"):
        _resolve("echo", "--x 'unclosed", tmp_path)


CONTRACT = {
    env.INFERENCE_CONTAINER: "echo",
    env.INFERENCE_CONTAINER_ENV: json.dumps([{"key": "MODEL", "value": "tiny"}]),
    env.INFERENCE_PORT: "9000",
    env.INFERENCE_HEALTH_PORT: "9000",
    env.NVCF_WORKER_TOKEN: "nvcft_secret",
    env.NVCF_FQDN_GRPC: "127.0.0.1:8081",
    env.FUNCTION_ID: "fid",
    env.FUNCTION_VERSION_ID: "vid",
    env.FUNCTION_NAME: "echo",
    env.NCA_ID: "acct",
    env.INSTANCE_TYPE: "ON-PREM.GPU.H100_2x",
    env.BACKEND: "local",
    env.REGION: "ncp",
}
WHERE = Where(
    instance_id="0-sr-r",
    cluster_id="c",
    port=4321,
    health_port=4322,
    directory=Path("/state/instances/0-sr-r"),
    devices=(2, 3),
    ready_timeout=7260,
    health_interval=1,
    telemetry_proxy="http://proxy.corp:3128",
)


def test_the_worker_gets_every_variable_the_contract_has_the_agent_set() -> None:
    worker = worker_environment({"PATH": "/bin"}, CONTRACT, WHERE)
    for var in env.CONTRACT:
        if var.name.startswith("NVCT_"):
            continue  # the task contract: only task instances get it (tests/integration/compute/test_tasks_local.py)
        if var.set_by == env.AGENT and "worker" in var.read_by:
            assert var.name in worker, var.name
        if (
            var.set_by == env.CP
            and var.name in CONTRACT
            and var.name not in (env.INFERENCE_PORT, env.INFERENCE_HEALTH_PORT)
        ):
            assert worker[var.name] == CONTRACT[var.name], var.name
    assert worker[env.INFERENCE_PORT] == worker[env.INFERENCE_HEALTH_PORT] == "4321"
    assert worker[env.HEALTH_PORT] == "4322" and worker[env.INSTANCE_ID] == worker[env.NVCF_INSTANCE_ID] == "0-sr-r"
    assert worker[env.SECRETS_FILE] == "/state/instances/0-sr-r/secrets.json"
    assert worker[env.BASE_ASSET_DIR] == "/state/instances/0-sr-r/assets" and worker["PATH"] == "/bin"
    assert env.NVCF_TELEMETRY_PROXY not in worker_environment({}, CONTRACT, attrs.evolve(WHERE, telemetry_proxy=None))
    # A health check on its own port cannot follow the instance's port.
    other = worker_environment({}, {**CONTRACT, env.INFERENCE_HEALTH_PORT: "9001"}, WHERE)
    assert other[env.INFERENCE_HEALTH_PORT] == "9001"


def test_the_inference_server_never_sees_the_worker_token() -> None:
    inference = inference_environment({"PATH": "/bin"}, CONTRACT, {"FROM_IMAGE": "1", "MODEL": "big"}, WHERE)
    assert env.NVCF_WORKER_TOKEN not in inference
    for var in env.CONTRACT:
        if var.set_by == env.AGENT and "inference" in var.read_by:
            assert var.name in inference, var.name
    assert inference[env.PORT] == inference[env.INFERENCE_PORT] == "4321"
    assert (
        inference[env.CUDA_VISIBLE_DEVICES] == "2,3" and inference["MODEL"] == "tiny" and inference["FROM_IMAGE"] == "1"
    )
    assert inference[env.NVCF_INSTANCETYPE_VALUE] == "ON-PREM.GPU.H100" and inference[env.NVCF_FUNCTION_ID] == "fid"
    with pytest.raises(LaunchError, match="INFERENCE_CONTAINER_ENV"):
        inference_environment({}, {env.INFERENCE_CONTAINER_ENV: "not json"}, {}, WHERE)


def test_instances_do_not_inherit_the_hosts_settings_or_another_instances_contract() -> None:
    host = {"PATH": "/bin", "NVCF_MONO__BUS__URL": "nats://x", env.NVCF_WORKER_TOKEN: "leaked", "HOME": "/root"}
    assert host_environment(host) == {"PATH": "/bin", "HOME": "/root"}


def test_helm_charts_are_refused_by_the_local_backend() -> None:
    backend = LocalBackend(
        catalog=CATALOG, environ={}, health=HealthSettings(), local=LocalSettings(), log=logging.getLogger("t")
    )
    assert backend.capabilities == ()
    spec = LaunchSpecification(gpu_name="H100", helm_chart="https://h.example.com/a/charts/echo-1.0.0.tgz")
    msg = CreationMessage(
        request_id="r",
        nca_id="a",
        action=Action.REQUEST_INSTANCES,
        cluster_id="c",
        instance_count=1,
        instance_type_name="ON-PREM.GPU.H100_1x",
        instance_type_value="ON-PREM.GPU.H100",
        gpu_type="H100",
        requested_gpu_count=1,
        message_batch_id="b",
        created_at="2026-01-01T00:00:00Z",
        launch_specification=spec,
    )
    refusal = backend.refuse(msg)
    assert refusal is not None and refusal.cause == states.CREATE_CONTAINER_ERROR and "Helm" in refusal.detail
    assert backend.refuse(evolve(msg, launch_specification=LaunchSpecification(gpu_name="H100"))) is None


def _backend(tmp_path: Path) -> LocalBackend:
    return LocalBackend(
        catalog=CATALOG,
        environ={},
        health=HealthSettings(),
        local=LocalSettings(),
        log=logging.getLogger("t"),
        state_dir=tmp_path,
    )


async def test_a_backend_closed_by_a_cancellation_closes_its_http_client(tmp_path: Path) -> None:
    """The host cancels a plugin that does not stop in time: the backend closes as its task is
    cancelled, and its HTTP client and its log shipping stop all the same."""
    backend = _backend(tmp_path)
    with anyio.CancelScope() as scope:
        async with backend:
            session = backend._http
            scope.cancel()
            await anyio.sleep(5)
    assert session is not None and session.closed
    assert backend._http is None


async def test_a_backend_whose_start_is_cancelled_closes_its_http_client(tmp_path: Path) -> None:
    """The host stops while the compute plugin is still starting: what the backend had opened is
    closed, not left to the garbage collector (CI saw an unclosed client session so)."""
    made: list[aiohttp.ClientSession] = []
    real = aiohttp.ClientSession

    def recorded(*args: Any, **kwargs: Any) -> aiohttp.ClientSession:
        made.append(real(*args, **kwargs))
        return made[-1]

    backend = _backend(tmp_path)
    with pytest.MonkeyPatch.context() as patch, anyio.CancelScope() as scope:
        patch.setattr(aiohttp, "ClientSession", recorded)
        scope.cancel()
        async with backend:
            pytest.fail("a cancelled start went on")
    assert len(made) == 1 and made[0].closed
