"""The bus leaves no socket open behind it: not after a failed connection attempt, nor after a connect
or a close that its deadline cut short. A socket nobody closes is closed by the garbage collector, perhaps after the
event loop has gone, and a long-running node would hold one for every failed attempt until then.
"""

from __future__ import annotations

import asyncio
import signal

import anyio
import pytest

from nvcf_mono.bus.api import ConnectionState
from nvcf_mono.bus.errors import BusUnavailable
from nvcf_mono.testing.nats_server import NatsServer
from tests.conftest import connect
from tests.support.sockets import tcp_sockets


def _sockets_to(port: int) -> int:
    """How many of this process's open TCP sockets lead to ``port`` (any state)."""
    return sum(1 for sock in tcp_sockets() if sock.remote_port == port)


async def test_failed_reconnection_attempts_leave_no_socket_open() -> None:
    """While the server is down something else answers on its port and hangs up before the handshake
    (a server still starting, a proxy without its backend). Each such attempt reached a socket; nats-py
    starts the next attempt without closing it, so it stayed open until the garbage collector found
    it, perhaps after the event loop had gone (CI saw that as an unclosed-socket warning)."""
    server = NatsServer().start()
    try:
        async with connect(server.url) as bus, bus.events() as events:
            await anyio.to_thread.run_sync(server.stop)
            answered = anyio.Event()
            attempts = 0

            def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
                nonlocal attempts
                attempts += 1
                writer.close()
                if attempts == 5:
                    answered.set()

            imposter = await asyncio.start_server(hang_up, "127.0.0.1", server.port)
            try:
                with anyio.fail_after(15):
                    await answered.wait()
            finally:
                imposter.close()
                await imposter.wait_closed()
            await anyio.to_thread.run_sync(server.start)
            with anyio.fail_after(15):
                async for event in events:
                    if event.kind == "reconnected":
                        break
            assert _sockets_to(server.port) == 1
            assert bus.state is ConnectionState.CONNECTED
        assert _sockets_to(server.port) == 0
    finally:
        server.close()


async def test_a_first_connect_cut_short_by_its_deadline_closes_its_socket() -> None:
    """Something on the port accepts and never says INFO: the deadline ends the connect mid-handshake."""
    accepted: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append((reader, writer))

    silent = await asyncio.start_server(hold, "127.0.0.1", 0)
    port = silent.sockets[0].getsockname()[1]
    try:
        with pytest.raises(BusUnavailable, match=r"within 0\.5s"):
            async with connect(f"nats://127.0.0.1:{port}", connect_retry_for=0.5, connect_timeout=5.0):
                pass
        assert accepted, "the connect never reached the port"
        with anyio.fail_after(5):
            assert await accepted[0][0].read() == b""  # the client hung up
        assert _sockets_to(port) == 0
    finally:
        for _, writer in accepted:
            writer.close()
        silent.close()
        await silent.wait_closed()


async def test_a_close_cut_short_by_its_deadline_closes_its_socket() -> None:
    """The server stops answering (SIGSTOP: alive, silent) while the bus drains at exit: the drain's
    deadline ends it, and the socket is closed all the same."""
    server = NatsServer().start()
    assert server.proc is not None
    try:
        async with connect(server.url, drain_timeout=0.3) as bus:
            async with bus.subscribe("sockets.held"):
                pass
            server.proc.send_signal(signal.SIGSTOP)
        assert _sockets_to(server.port) == 0
    finally:
        server.proc.send_signal(signal.SIGCONT)
        server.close()
