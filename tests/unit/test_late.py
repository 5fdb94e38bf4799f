"""The late-bound holder and its one answer: a route whose parts are not made yet says 503, then works."""

from __future__ import annotations

import logging

import aiohttp
import pytest
from aiohttp import web

from nvcf_mono.config.model import HttpSettings
from nvcf_mono.http.server import HttpServer
from nvcf_mono.late import Late, NotReady
from nvcf_mono.lifecycle import InflightTracker
from nvcf_mono.metrics import Metrics
from nvcf_mono.plugin import Contributions, Route


def test_a_holder_raises_until_set_and_then_holds_its_value() -> None:
    held: Late[str] = Late("the answer")
    assert not held.is_set
    with pytest.raises(NotReady, match="the answer is starting"):
        held.get()
    held.set("42")
    assert held.is_set and held.get() == "42"


async def test_the_http_server_answers_a_value_not_made_yet_with_503_and_retry_after() -> None:
    greeting: Late[str] = Late("the greeting")

    async def hello(request: web.Request) -> web.Response:
        return web.Response(text=greeting.get())

    contributions = Contributions(routes=[Route(owner="demo", method="GET", path="/hello", handler=hello)])
    server = HttpServer(
        HttpSettings(host="127.0.0.1", port=0),
        contributions,
        host_routes=(),
        is_running=lambda owner: True,
        inflight=InflightTracker(),
        metrics=Metrics(),
        log=logging.getLogger("test"),
    )
    port = await server.start()
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}/hello") as reply:
                assert reply.status == 503
                assert reply.headers["Retry-After"] == "1"
                assert reply.content_type == "application/problem+json"
                assert (await reply.json())["detail"] == "the greeting is starting"
            greeting.set("hi")
            async with session.get(f"http://127.0.0.1:{port}/hello") as reply:
                assert reply.status == 200 and await reply.text() == "hi"
    finally:
        await server.close()
