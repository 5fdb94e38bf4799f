"""Shared fixtures: one real nats-server per test session, unique names per test."""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager

import pytest

from nvcf_mono.bus.nats import NatsBus, open_nats_bus
from nvcf_mono.config.model import BusSettings
from nvcf_mono.metrics import Metrics
from nvcf_mono.testing.nats_server import NatsServer
from tests.support.leftovers import kill, processes_under

#: Test directories whose tests start a platform, a host or a bus, and so talk to a real nats-server
#: (except the modules named in _WITHOUT_NATS).
_NATS_DIRS = frozenset({"integration", "e2e", "chaos"})
_WITHOUT_NATS = frozenset({"tests/integration/test_grpc_server.py"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark ``nats`` every test that talks to a real nats-server (by directory, or by the ``nats_server``
    fixture), so ``-m "not nats"`` runs the suite that needs none; modules may also say so themselves.
    """
    for item in items:
        path = item.path.relative_to(config.rootpath).as_posix()
        parts = path.split("/")
        in_dir = len(parts) > 2 and parts[1] in _NATS_DIRS and path not in _WITHOUT_NATS
        if in_dir or "nats_server" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.nats)


@pytest.fixture(scope="session")
def nats_server() -> Iterator[NatsServer]:
    """A real nats-server with JetStream, shared by the session (tests isolate by unique names)."""
    server = NatsServer().start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(autouse=True)
def _nothing_outlives_its_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each test that had a ``tmp_path``: kill what still runs in it (a failed test's instances)."""
    yield
    tmp = request.node.funcargs.get("tmp_path")
    if tmp is not None:
        kill(processes_under(tmp))


@pytest.fixture
def unique() -> Callable[[str], str]:
    """``unique("orders")`` -> ``orders_3f2a...``: stream, bucket and subject names no other test uses."""
    token = uuid.uuid4().hex[:10]
    return lambda prefix: f"{prefix}_{token}"


@asynccontextmanager
async def connect(url: str, **settings: object) -> AsyncIterator[NatsBus]:
    """A bus connected to ``url`` (open it inside the test body, not in a fixture)."""
    options = {"connect_retry_for": 5.0, "request_timeout": 5.0, "reconnect_wait": 0.1, **settings}
    async with open_nats_bus(
        BusSettings(**options),  # type: ignore[arg-type]
        servers=[url],
        name="tests",
        metrics=Metrics(),
        log=logging.getLogger("tests.bus"),
    ) as bus:
        yield bus
