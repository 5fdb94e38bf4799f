"""A throwaway nats-server with JetStream for tests: free port, store in a temporary directory."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, final

import anyio
from nats.aio.client import Client as NatsClient

from nvcf_mono.bus.embedded import find_nats_server
from nvcf_mono.ports import spare_port


@final
class NatsServer:
    """Start with :meth:`start`, stop with :meth:`stop`; :meth:`restart` keeps the port and the store."""

    def __init__(
        self, *, store_dir: Path | None = None, port: int | None = None, extra_args: Sequence[str] = ()
    ) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="nvcf-mono-nats-") if store_dir is None else None
        self.store_dir = store_dir or Path(self._tmp.name if self._tmp else ".")
        self.port = port or spare_port()
        self.binary = find_nats_server(None)
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.store_dir / "nats-server.log"
        self._extra = tuple(extra_args)

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self, timeout: float = 10.0) -> NatsServer:
        """Launch and wait until the port accepts connections."""
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [
                str(self.binary),
                *("-a", "127.0.0.1", "-p", str(self.port), "-js", "-sd", str(self.store_dir / "js")),
                *self._extra,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"nats-server exited: {self.log_path.read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                    if sock.recv(4).startswith(b"INFO"):
                        return self
            except OSError:
                time.sleep(0.02)
        raise RuntimeError(f"nats-server did not start within {timeout}s")

    def kill(self) -> None:
        """SIGKILL, as a machine that dies does."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def stop(self) -> None:
        """Terminate and wait."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def restart(self) -> None:
        """Stop and start again on the same port and store."""
        self.stop()
        self.start()

    def close(self) -> None:
        """Stop and remove the temporary store."""
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()


@final
class NatsCluster:
    """Three nats-servers with JetStream clustered over routes on loopback (for losing a node in a test)."""

    def __init__(self, size: int = 3) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="nvcf-mono-natscluster-")
        self._size = size
        self.nodes: list[NatsServer] = []
        self._choose_ports()

    def _choose_ports(self) -> None:
        """Client and route ports for every node, and empty stores."""
        routes = [spare_port() for _ in range(self._size)]
        route_urls = ",".join(f"nats-route://127.0.0.1:{p}" for p in routes)
        self.nodes = []
        for i, route in enumerate(routes):
            store = Path(self._tmp.name) / f"n{i}"
            shutil.rmtree(store, ignore_errors=True)
            store.mkdir()
            args = ("--name", f"n{i}", "--cluster_name", "nvcf", "--cluster", f"nats://127.0.0.1:{route}")
            self.nodes.append(NatsServer(store_dir=store, extra_args=(*args, "--routes", route_urls)))

    @property
    def urls(self) -> str:
        """The client URLs of every node, comma-separated (``bus.url``)."""
        return ",".join(node.url for node in self.nodes)

    def node(self, name: str) -> NatsServer:
        """The node a JetStream stream names as its leader (``n0``, ``n1``, ...)."""
        return self.nodes[int(name.removeprefix("n"))]

    def start(self, timeout: float = 30.0, attempts: int = 3) -> NatsCluster:
        """Start every node. A port chosen free can be taken before a node binds it (by another test's
        server, chosen the same way): the cluster then starts again on new ports; after ``attempts``
        it is closed and the last error raised, so no node is left running.
        """
        attempt = 1
        while True:
            try:
                for node in self.nodes:
                    node.start(timeout=timeout)
                return self
            except RuntimeError:
                for node in self.nodes:
                    node.stop()
                if attempt >= attempts:
                    self.close()
                    raise
            attempt += 1
            self._choose_ports()

    def close(self) -> None:
        for node in self.nodes:
            node.close()
        self._tmp.cleanup()


async def raw_client(url: str, **options: Any) -> NatsClient:
    """A plain nats-py connection (for checking what a client may do); closed again when connecting fails."""
    nc = NatsClient()
    try:
        with anyio.fail_after(10):
            await nc.connect(url, **options)
    except BaseException:
        with anyio.CancelScope(shield=True), anyio.move_on_after(5):
            await nc.close()  # nats-py leaves the socket of a refused connection open otherwise
        raise
    return nc
