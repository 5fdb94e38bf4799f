"""A server restart under a connected bus: events, transparent reconnection, nothing stored is lost."""

from __future__ import annotations

import anyio
import pytest

from nvcf_mono.bus.api import BusEvent, ConnectionState, StreamSpec
from nvcf_mono.testing.nats_server import NatsServer
from tests.conftest import connect

pytestmark = pytest.mark.nats


async def test_the_bus_reconnects_after_a_server_restart() -> None:
    server = NatsServer().start()  # its own server: restarting the shared one would disturb other tests
    try:
        async with connect(server.url, reconnect_wait=0.1) as bus:
            await bus.ensure_stream(StreamSpec(name="RECON", subjects=("recon.>",)))
            await bus.stream("RECON").publish("recon.before", b"1")
            events: list[BusEvent] = []
            async with bus.events() as stream:
                await anyio.to_thread.run_sync(server.restart)
                with anyio.fail_after(15):
                    async for event in stream:
                        events.append(event)
                        if event.kind == "reconnected":
                            break
            assert [e.kind for e in events if e.kind in ("disconnected", "reconnected")] == [
                "disconnected",
                "reconnected",
            ]
            assert bus.state is ConnectionState.CONNECTED
            assert bus.statistics().reconnects == 1
            with anyio.fail_after(10):
                ack = await bus.stream("RECON").publish("recon.after", b"2")
                assert ack.seq == 2
                async with bus.subscribe("recon.core") as sub:
                    await bus.publish("recon.core", b"hello again")
                    assert (await sub.next(timeout=5)).data == b"hello again"
            stored = await bus.stream("RECON").get_last("recon.before")
            assert stored is not None and stored.data == b"1"
    finally:
        server.close()
