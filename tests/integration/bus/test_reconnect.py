"""A restart of the session's nats-server under a connected bus: events, recovery, nothing stored lost.

The shared server comes back on the same port with the same store; the test makes sure it is
running again whatever happens, so the tests after it are not disturbed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial

import anyio
import pytest

from nvcf_mono.bus.api import BusEvent, ConnectionState, ConsumerSpec, Msg, StreamSpec
from nvcf_mono.bus.errors import RequestTimeout
from nvcf_mono.testing.nats_server import NatsServer
from tests.conftest import connect


@pytest.fixture
def restartable(nats_server: NatsServer) -> Iterator[NatsServer]:
    """The session server, guaranteed to be running again after the test."""
    try:
        yield nats_server
    finally:
        if nats_server.proc is None or nats_server.proc.poll() is not None:
            nats_server.start()


async def test_the_bus_recovers_from_a_server_restart(restartable: NatsServer, unique: Callable[[str], str]) -> None:
    name = unique("RECON")
    low = name.lower()
    served = unique("svc")

    async def echo(msg: Msg) -> bytes:
        return b"echo:" + msg.data

    async with connect(restartable.url) as bus, anyio.create_task_group() as tg:
        await bus.ensure_stream(StreamSpec(name=name, subjects=(f"{low}.>",), storage="file"))
        stream = bus.stream(name)
        await stream.ensure_consumer(ConsumerSpec(durable="w", ack_wait=5))
        for i in range(3):
            await stream.publish(f"{low}.before", str(i).encode())
        with anyio.fail_after(10):
            await tg.start(partial(bus.serve, served, echo))
            assert (await bus.request(served, b"1", timeout=5)).data == b"echo:1"

        events: list[BusEvent] = []
        async with bus.events() as listener:
            await anyio.to_thread.run_sync(restartable.restart)
            with anyio.fail_after(15):
                async for event in listener:
                    events.append(event)
                    if event.kind == "reconnected":
                        break
        kinds = [e.kind for e in events if e.kind in ("disconnected", "reconnected")]
        assert kinds == ["disconnected", "reconnected"]
        assert bus.state is ConnectionState.CONNECTED
        assert bus.statistics().reconnects == 1

        with anyio.fail_after(10):
            # Core traffic flows again: the subscriptions were restored, requests reach the responder.
            assert (await bus.request(served, b"2", timeout=5)).data == b"echo:2"
            async with bus.subscribe(f"{unique('core')}.x") as sub:
                await bus.publish(sub.subject, b"hello again")
                assert (await sub.next(timeout=5)).data == b"hello again"
            # The stream and its durable consumer survived the restart with their messages.
            state = await stream.info()
            assert (state.messages, state.last_seq) == (3, 3)
            ack = await stream.publish(f"{low}.after", b"3")
            assert ack.seq == 4
            last = await stream.get_last(f"{low}.before")
            assert last is not None and last.data == b"2"
            async with stream.consume("w", fetch_timeout=1) as consumer:
                deliveries = aiter(consumer)
                got = [await anext(deliveries) for _ in range(4)]
                assert [d.data for d in got] == [b"0", b"1", b"2", b"3"]
                for d in got:
                    await d.ack_sync()
        tg.cancel_scope.cancel()
    assert restartable.proc is not None and restartable.proc.poll() is None


async def test_publishes_are_buffered_while_the_server_is_down(
    restartable: NatsServer, unique: Callable[[str], str]
) -> None:
    subject = unique("buffered")
    async with connect(restartable.url) as bus, bus.events() as events, bus.subscribe(subject) as sub:
        await anyio.to_thread.run_sync(restartable.stop)
        with anyio.fail_after(10):
            async for event in events:
                if event.kind == "disconnected":
                    break
        assert bus.state is ConnectionState.RECONNECTING
        await bus.publish(subject, b"sent while down")  # held by the client, not lost
        with anyio.fail_after(10), pytest.raises(RequestTimeout):
            await bus.request(unique("nobody"), b"?", timeout=0.3)
        await anyio.to_thread.run_sync(restartable.start)
        with anyio.fail_after(10):
            async for event in events:
                if event.kind == "reconnected":
                    break
            assert (await sub.next(timeout=5)).data == b"sent while down"
    assert restartable.proc is not None and restartable.proc.poll() is None


async def test_a_bus_in_a_reconnections_handshake_is_reconnecting(nats_server: NatsServer) -> None:
    """nats-py marks the handshake with the server a reconnection reached as CONNECTING. The bus is
    made connected, so that is a reconnection too: under load the LLM gateway's readiness said its bus
    was "connecting" after the embedded server's crash. The handshake is held still here by setting
    nats-py's status, which a live reconnection passes through too quickly to catch."""
    from nats.aio.client import Client as NatsClient

    async with connect(nats_server.url) as bus:
        nc = bus._nc
        nc._status = NatsClient.CONNECTING
        try:
            during = bus.state
        finally:
            nc._status = NatsClient.CONNECTED
        assert (during, bus.state) == (ConnectionState.RECONNECTING, ConnectionState.CONNECTED)
