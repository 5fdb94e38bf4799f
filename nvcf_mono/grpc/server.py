"""Assemble and run the host's grpclib server; calls to a plugin that is not running get UNAVAILABLE."""

from __future__ import annotations

import asyncio
import logging
import typing
from collections.abc import Callable
from typing import Any, final

import anyio
from grpclib.const import Handler, Status
from grpclib.exceptions import GRPCError
from grpclib.server import Server, Stream

from nvcf_mono.config.model import GrpcSettings
from nvcf_mono.errors import NvcfMonoError
from nvcf_mono.lifecycle import InflightTracker
from nvcf_mono.metrics import Metrics

IsRunning = Callable[[str], bool]


class GrpcServerError(NvcfMonoError):
    """The server could not be assembled or bound."""


@final
class _Router:
    """One object whose ``__mapping__`` is every contributed method, gated and counted."""

    def __init__(self, mapping: dict[str, Handler]) -> None:
        self._mapping = mapping

    def __mapping__(self) -> dict[str, Handler]:
        return self._mapping


def _wrap(
    path: str, owner: str, handler: Handler, *, is_running: IsRunning, inflight: InflightTracker, calls: Any
) -> Handler:
    func = handler.func

    async def gated(stream: Stream[Any, Any]) -> None:
        if not is_running(owner):
            raise GRPCError(Status.UNAVAILABLE, f"served by plugin {owner!r}, which is not running")
        status = "OK"
        with inflight.track():
            try:
                await func(stream)
            except GRPCError as err:
                status = err.status.name
                raise
            except anyio.get_cancelled_exc_class():
                status = "CANCELLED"
                raise
            except Exception:
                status = "INTERNAL"
                raise
            finally:
                calls.inc(method=path, code=status)

    return Handler(gated, handler.cardinality, handler.request_type, handler.reply_type)


@final
class GrpcServer:
    """The host's gRPC port."""

    def __init__(
        self,
        settings: GrpcSettings,
        servicers: list[tuple[str, Any]],
        *,
        is_running: IsRunning,
        inflight: InflightTracker,
        metrics: Metrics,
        log: logging.Logger,
    ) -> None:
        self._settings = settings
        self._log = log
        calls = metrics.counter("grpc_server_handled_total", "gRPC calls handled.", ["method", "code"])
        mapping: dict[str, Handler] = {}
        owners: dict[str, str] = {}
        for owner, servicer in servicers:
            for path, handler in servicer.__mapping__().items():
                if path in mapping:
                    raise GrpcServerError(f"gRPC method {path} is served by both {owners[path]!r} and {owner!r}")
                owners[path] = owner
                mapping[path] = (
                    handler
                    if owner == "host"
                    else _wrap(path, owner, handler, is_running=is_running, inflight=inflight, calls=calls)
                )
        self._server = Server([_Router(mapping)])
        self.port = 0

    async def start(self) -> int:
        """Bind and serve; returns the bound port."""
        try:
            await self._server.start(self._settings.host, self._settings.port, reuse_address=True)
        except OSError as err:
            hint = " (set grpc.port, or 0 for a free port)" if err.errno in (48, 98) else ""
            raise GrpcServerError(
                f"cannot listen on {self._settings.host}:{self._settings.port}: {err.strerror or err}{hint}"
            ) from err
        listener = typing.cast("asyncio.Server | None", self._server._server)
        sockets = listener.sockets if listener is not None else ()
        self.port = int(sockets[0].getsockname()[1]) if sockets else self._settings.port
        return self.port

    async def stop_accepting(self) -> None:
        """Stop listening; calls in progress continue. grpclib's close() would cancel them at once."""
        listener = self._server._server
        if listener is not None:
            listener.close()

    async def close(self) -> None:
        """Cancel what is left and wait for the handlers to finish."""
        if self._server._server is None:
            return
        self._server.close()
        await self._server.wait_closed()
