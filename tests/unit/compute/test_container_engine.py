"""The container engine's image list, against a stand-in engine on a real socket (no engine here can be
made to fail its list on cue: Podman 4.3 does so when an image it found is removed as it reads it)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiodocker
import pytest
from aiohttp import web

from nvcf_mono.planes.compute.backends.containers.engine import Engine, EngineError

IMAGE = {"Id": "sha256:" + "a" * 64, "RepoTags": ["registry.example.com/echo:1"]}
LAYERS = ["sha256:" + "b" * 64, "sha256:" + "c" * 64]


@asynccontextmanager
async def engine_answering(*lists: tuple[int, object]) -> AsyncIterator[tuple[Engine, list[str]]]:
    """An engine whose image lists answer ``lists`` in turn (status, body); what it was asked, in order."""
    asked: list[str] = []
    answers = list(lists)

    async def handle(request: web.Request) -> web.Response:
        asked.append(request.path)
        if request.path.endswith("/images/json"):
            status, body = answers.pop(0)
            return web.json_response(body, status=status)
        return web.json_response({"Id": IMAGE["Id"], "RootFS": {"Type": "layers", "Layers": LAYERS}})

    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    docker = aiodocker.Docker(url=f"http://127.0.0.1:{port}", api_version="v1.41")
    try:
        yield Engine(docker, "podman", "4.3.1", api_timeout=5.0), asked
    finally:
        await docker.close()
        await runner.cleanup()


async def test_a_list_the_engine_fails_is_asked_again() -> None:
    gone = (500, {"message": "image not known"})
    async with engine_answering(gone, gone, (200, [IMAGE])) as (engine, asked):
        assert await engine.layers_of(lambda names: True) == set(LAYERS)
    assert [path.rsplit("/", 2)[-2:] for path in asked].count(["images", "json"]) == 3


async def test_a_list_that_keeps_failing_or_is_refused_says_so() -> None:
    gone = (500, {"message": "image not known"})
    async with engine_answering(gone, gone, gone) as (engine, _):
        with pytest.raises(EngineError, match="image not known"):
            await engine.layers_of(lambda names: True)
    async with engine_answering((403, {"message": "no"}), (200, [IMAGE])) as (engine, asked):
        with pytest.raises(EngineError, match="no"):
            await engine.layers_of(lambda names: True)
        assert len(asked) == 1  # a refusal is not asked again
