"""The gateway's limits shared by invocation nodes over a real nats-server: one limit, whichever node is called."""

from __future__ import annotations

import logging
from collections.abc import Callable

import anyio
import pytest

from nvcf_mono.auth.principal import Principal
from nvcf_mono.contracts import subjects
from nvcf_mono.planes.invocation.llm.errors import GatewayError
from nvcf_mono.planes.invocation.llm.limits import Limits
from nvcf_mono.planes.invocation.llm.settings import LlmGatewaySettings
from nvcf_mono.planes.invocation.llm.sharing import LimitSharing
from nvcf_mono.testing.nats_server import NatsServer
from tests.conftest import connect

LOG = logging.getLogger("test.llm.sharing")
KEY = ("account", "acct-a", "requests")


def caller() -> Principal:
    return Principal(kind="jwt", subject="u", account="acct-a", scopes=frozenset())


async def _until(check: Callable[[], bool], timeout: float = 10) -> None:
    with anyio.fail_after(timeout):
        while not check():
            await anyio.sleep(0.02)


async def test_two_nodes_admit_one_limit_between_them(nats_server: NatsServer) -> None:
    settings = LlmGatewaySettings(requests_per_minute=6)
    a, b = Limits(settings), Limits(settings)
    async with connect(nats_server.url) as bus_a, connect(nats_server.url) as bus_b:
        async with anyio.create_task_group() as tg:
            # One configured node id for both (as two replicas given none): they still hear each other.
            await tg.start(LimitSharing(bus_a, a, "invocation", LOG).run)
            await tg.start(LimitSharing(bus_b, b, "invocation", LOG).run)
            # Garbage on the subject is dropped; the nodes keep listening.
            for garbage in (b"not json", b'{"n": "x", "t": [["account", "acct-a", "requests", true]]}'):
                await bus_a.publish(subjects.LLM_GATEWAY_TAKEN, garbage)
            for _ in range(4):
                a.admit(caller(), 1)
            await _until(lambda: KEY in b._buckets and b._buckets[KEY].level < 2.5)  # heard within a report
            b.admit(caller(), 1)
            b.admit(caller(), 1)
            with pytest.raises(GatewayError) as err:
                b.admit(caller(), 1)
            assert err.value.status == 429
            await _until(lambda: a._buckets[KEY].level < 0.5)  # and a hears b's two
            with pytest.raises(GatewayError):
                a.admit(caller(), 1)
            assert a._buckets[KEY].level > -0.5  # its own report was not taken twice
            tg.cancel_scope.cancel()
        assert not a.sharing and a.taken() == {}  # stopped: nothing more is kept for reports
