"""A running platform in a test body: an all-in-one host on its own NATS, API clients, scripted agents.

Use inside the test (``async with platform(tmp_path) as p:``), never across a fixture ``yield``.
Every API client validates the responses it receives against the host's ``/v3/openapi``.
"""

from __future__ import annotations

import functools
import json
import logging
import os
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import attrs

from nvcf_mono.auth import scopes
from nvcf_mono.auth.keystore import API_KEY_STORE
from nvcf_mono.auth.secret import PlatformSecret
from nvcf_mono.bus.nats import NatsBus, open_nats_bus
from nvcf_mono.config.model import BusSettings
from nvcf_mono.contracts import buckets
from nvcf_mono.host import Host
from nvcf_mono.metrics import Metrics
from nvcf_mono.models.account import Account
from nvcf_mono.models.api_key import FUNCTIONS_SERVICE_ID, Authorizations, KeyResource, Policy
from nvcf_mono.models.common import now_iso
from nvcf_mono.testing.host import running_host
from nvcf_mono.testing.openapi import ResponseChecker
from nvcf_mono.testing.platform import Api, credentials, platform_config, wait_for
from nvcf_mono.testing.scripted_agent import ProcessLauncher, ScriptedAgent, gpu_inventory, inference_command

CONTAINER_FUNCTION = {
    "name": "echo",
    "inferenceUrl": "/echo",
    "inferencePort": 9000,
    "containerImage": "registry.example.com/echo:1",
    "health": {"protocol": "HTTP", "uri": "/health", "port": 9000, "timeout": "PT5S", "expectedStatusCode": 200},
}


@attrs.define
class Platform:
    """One running all-in-one platform with its clients."""

    host: Host
    bus: NatsBus
    admin: Api
    key: Api
    task_key: Api
    anonymous: Api

    def api(self, token: str | None) -> Api:
        return self.admin.as_(token)


@functools.lru_cache(maxsize=8)
def _document(body: bytes) -> Mapping[str, Any]:
    """The parsed /v3/openapi, once per distinct document (a test process starts hundreds of platforms)."""
    document: Mapping[str, Any] = json.loads(body)
    return document


@asynccontextmanager
async def platform(tmp_path: Path, **settings: Any) -> AsyncIterator[Platform]:
    """An all-in-one host on its own embedded NATS, with admin, key and anonymous clients."""
    config = platform_config(tmp_path / "state", settings=settings)
    async with running_host(config) as host, aiohttp.ClientSession() as session:
        creds = credentials(host)
        base = host.endpoints.url
        async with session.get(f"{base}/v3/openapi") as resp:
            checker = ResponseChecker(_document(await resp.read()))
        async with open_nats_bus(
            BusSettings(connect_retry_for=5.0, request_timeout=5.0),
            servers=host.endpoints.nats_url.split(","),
            name="tests",
            metrics=Metrics(),
            log=logging.getLogger("tests.bus"),
        ) as bus:
            yield Platform(
                host=host,
                bus=bus,
                admin=Api(session, base, creds["admin_token"], checker=checker),
                key=Api(session, base, creds["api_key"], checker=checker),
                task_key=Api(session, base, creds["task_api_key"], checker=checker),
                anonymous=Api(session, base, None, checker=checker),
            )


@asynccontextmanager
async def two_invocation_nodes(tmp_path: Path, **settings: Any) -> AsyncIterator[tuple[Platform, Host, Api]]:
    """An all-in-one platform (node ``node-a``), and a host with role invocation (``node-b``) on its NATS and
    secret; yields the platform, the second host, and the key client pointed at the second host.
    """
    secret = tmp_path / "platform-secret"
    PlatformSecret.generate().write(secret)
    first = {**settings, "node.id": "node-a", "plugins.auth.secret_file": str(secret)}
    async with platform(tmp_path, **first) as p:
        config = platform_config(
            tmp_path / "node-b",
            nats_url=p.host.endpoints.nats_url,
            role="invocation",
            node="node-b",
            secret_file=secret,
            settings=settings,
        )
        async with running_host(config) as b:
            assert p.key.token is not None
            yield p, b, Api(p.key.session, b.endpoints.url, p.key.token, checker=p.key.checker)


@asynccontextmanager
async def agent(bus: NatsBus, **options: Any) -> AsyncIterator[ScriptedAgent]:
    """A scripted agent for the duration of the block (default: one node with 8 H100)."""
    options.setdefault("cluster_id", "6b1e4d3a-58a1-4a5e-9d58-2a1c0f000001")
    options.setdefault("cluster_name", "local")
    options.setdefault("gpus", [gpu_inventory("H100", 8)])
    fake = ScriptedAgent(bus, **options)
    async with anyio.create_task_group() as tg:
        await tg.start(fake.run)
        try:
            yield fake
        finally:
            tg.cancel_scope.cancel()


ECHO_FUNCTION = {
    "name": "echo",
    "inferenceUrl": "/echo",
    "inferencePort": 9000,
    "containerImage": "echo",
    "health": {"protocol": "HTTP", "uri": "/health", "port": 9000, "timeout": "PT5S", "expectedStatusCode": 200},
}

#: The example model server (image ``llm``, ``nvcf_mono.examples.llm``), reachable as model ``tiny-llm``.
LLM_FUNCTION = {
    "name": "tiny-llm",
    "inferenceUrl": "/v1/chat/completions",
    "inferencePort": 8000,
    "containerImage": "llm",
    "health": {
        "protocol": "HTTP",
        "uri": "/v2/health/ready",
        "port": 8000,
        "timeout": "PT5S",
        "expectedStatusCode": 200,
    },
    "tags": ["model=tiny-llm"],
}


@asynccontextmanager
async def launching_agent(
    p: Platform,
    workdir: Path,
    *,
    worker_addresses: Sequence[str] = (),
    inference: Callable[[Mapping[str, str], int], list[str]] = inference_command,
    **options: Any,
) -> AsyncIterator[ScriptedAgent]:
    """A scripted agent that starts real instances: the test echo server and ``nvcf-mono worker``.

    ``worker_addresses``: the invocation nodes' gRPC addresses, dialled by the instances in turn;
    ``inference``: the inference server's command line for an instance's environment and port.
    """
    options.setdefault("cluster_id", "6b1e4d3a-58a1-4a5e-9d58-2a1c0f000002")
    options.setdefault("cluster_name", "local")
    options.setdefault("gpus", [gpu_inventory("H100", 8)])
    environ = dict(os.environ)  # noqa: TID251 - child processes inherit it
    launcher = ProcessLauncher(workdir, environ=environ, worker_addresses=worker_addresses, inference=inference)
    fake = ScriptedAgent(p.bus, behaviour="launch", launcher=launcher, **options)
    async with anyio.create_task_group() as tg:
        await tg.start(fake.run)
        try:
            yield fake
        finally:
            tg.cancel_scope.cancel()


async def deployed(
    api: Api,
    function: dict[str, Any] | None = None,
    *,
    min_instances: int = 1,
    max_instances: int = 1,
    concurrency: int = 1,
) -> tuple[str, str]:
    """Create and deploy a function; returns (function id, version id) once it is ACTIVE."""
    created = await api.post("/v2/nvcf/functions", function or ECHO_FUNCTION)
    assert created.status == 200, created.body
    fid, vid = created.json["function"]["id"], created.json["function"]["versionId"]
    d = f"/v2/nvcf/deployments/functions/{fid}/versions/{vid}"
    spec = {
        "gpu": "H100",
        "instanceType": "ON-PREM.GPU.H100_1x",
        "minInstances": min_instances,
        "maxInstances": max_instances,
        "maxRequestConcurrency": concurrency,
    }
    reply = await api.post(d, {"deploymentSpecifications": [spec]})
    assert reply.status == 200, reply.body

    async def active() -> bool:
        return bool((await api.get(d)).json["deployment"]["functionStatus"] == "ACTIVE")

    await wait_for(active, timeout=60, what="ACTIVE")
    return fid, vid


async def other_account_key(
    p: Platform,
    nca_id: str,
    scope_names: Iterable[str] = scopes.FUNCTION_KEY_SCOPES,
    *,
    shared: bool = True,
    create_account: bool = True,
) -> str:
    """An API key of the account ``nca_id`` (made straight in the buckets unless ``create_account`` is
    False) holding ``scope_names``, over its own functions and, when ``shared``, those shared with it.
    """
    if create_account:
        accounts = buckets.typed(p.bus.kv(buckets.ACCOUNTS.name), buckets.ACCOUNT)
        await accounts.put(nca_id, Account(nca_id=nca_id, name=nca_id, last_updated_at=now_iso()))
    resources = [KeyResource(id="*", type="account-functions")]
    if shared:
        resources.append(KeyResource(id="*", type="authorized-functions"))
    policy = Policy(scopes=tuple(sorted(scope_names)), resources=tuple(resources))
    _, value = await p.host.services.get(API_KEY_STORE).create(
        nca_id=nca_id,
        owner_id=f"{nca_id}-user",
        description="test key",
        authorizations=Authorizations(policies=(policy,)),
        expires_in=timedelta(hours=1),
        issuer_service_id=FUNCTIONS_SERVICE_ID,
        audience_service_ids=(FUNCTIONS_SERVICE_ID,),
    )
    return value
