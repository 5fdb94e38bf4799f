"""Assemble and run the host's grpclib server; calls to a plugin that is not running get UNAVAILABLE.

A servicer may also define ``__fallback__(path) -> Handler | None``: the handler for methods of
services no servicer serves (at most one servicer does; the invocation plane's gRPC proxy). Unknown
methods of the host's own services stay UNIMPLEMENTED.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import typing
import weakref
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, final, overload

import anyio
from grpclib.const import Cardinality, Handler, Status
from grpclib.encoding.base import StatusDetailsCodecBase
from grpclib.encoding.proto import ProtoStatusDetailsCodec, _googleapis_available
from grpclib.exceptions import GRPCError
from grpclib.protocol import H2Protocol
from grpclib.server import Server, Stream

from nvcf_mono.config.model import GrpcSettings
from nvcf_mono.errors import NvcfMonoError
from nvcf_mono.grpc import compression, hpack_plain
from nvcf_mono.grpc.batch import STREAM_GONE
from nvcf_mono.grpc.raw import RawMessage, encode_status
from nvcf_mono.late import NotReady
from nvcf_mono.lifecycle import GRPC_CALL, GRPC_STREAM, InflightTracker
from nvcf_mono.metrics import Metrics

IsRunning = Callable[[str], bool]
Fallback = Callable[[str], Handler | None]
#: Whether the fallback takes a call by its request head, whatever its path (``__claims__``).
Claims = Callable[[Sequence[tuple[str, str]]], bool]
#: The metrics label of calls served by the fallback (their paths are the callers' choice).
FALLBACK_LABEL = "*"
_T = TypeVar("_T")


class GrpcServerError(NvcfMonoError):
    """The server could not be assembled or bound."""


@final
class _Router:
    """One object whose ``__mapping__`` is every contributed method, gated and counted."""

    def __init__(self, mapping: dict[str, Handler]) -> None:
        self._mapping = mapping

    def __mapping__(self) -> dict[str, Handler]:
        return self._mapping


async def _unimplemented(stream: Stream[Any, Any]) -> None:
    raise GRPCError(Status.UNIMPLEMENTED, "Method not found")


_UNIMPLEMENTED = Handler(_unimplemented, Cardinality.STREAM_STREAM, RawMessage, RawMessage)


@final
class _FallbackOnly:
    """The method table of a call the fallback claims: every path is the fallback's."""

    def __init__(self, fallback: Fallback) -> None:
        self._fallback = fallback

    def get(self, key: str, default: Any = None, /) -> Any:
        return self._fallback(key) or default


class _Mapping(dict[str, Handler]):
    """The method table grpclib consults with ``get(path)``; unserved services go to the fallback, and so do
    calls whose head the fallback claims (``for_call``, see :mod:`nvcf_mono.grpc.request_head`).
    """

    def __init__(self, mapping: dict[str, Handler], fallback: Fallback, claims: Claims | None = None) -> None:
        super().__init__(mapping)
        self._services = frozenset(path.rpartition("/")[0] for path in mapping)
        self._fallback = fallback
        self._claims = claims

    def for_call(self, headers: Sequence[tuple[str, str]]) -> Any:
        if self._claims is not None and self._claims(headers):
            return _FallbackOnly(self._fallback)
        return self

    @overload
    def get(self, key: str, default: None = None, /) -> Handler | None: ...
    @overload
    def get(self, key: str, default: Handler, /) -> Handler: ...
    @overload
    def get(self, key: str, default: _T, /) -> Handler | _T: ...
    def get(self, key: str, default: Any = None, /) -> Any:
        handler = super().get(key)
        if handler is not None:
            return handler
        if key.rpartition("/")[0] in self._services:
            # A well-formed UNIMPLEMENTED (grpclib's own answer lacks the content-type some clients need).
            return _UNIMPLEMENTED
        return self._fallback(key) or default


@final
class _StatusDetails(StatusDetailsCodecBase):
    """Status details given as bytes (an encoded google.rpc.Status, as a relayed call's) are sent as they are."""

    def __init__(self) -> None:
        self._proto = ProtoStatusDetailsCodec() if _googleapis_available() else None

    def encode(self, status: Status, message: str | None, details: Any) -> bytes:
        if isinstance(details, bytes):
            return details
        if self._proto is not None:
            return self._proto.encode(status, message, details)
        # Without googleapis only the status itself can be encoded (grpclib would have dropped the details).
        return encode_status(status, message)

    def decode(self, status: Status, message: str | None, data: bytes) -> Any:
        return data


def _reset_while_sending(err: BaseException) -> bool:
    """Whether ``err`` is only sends failing on a call its peer reset, and grpclib has cancelled the handler.

    grpclib must then see a cancellation, not those errors (else it logs "Failed to handle cancellation"
    with a traceback). They come instead when a send meets the reset before the cancellation does: in
    the handler itself, after the cancellation was lost on its way (Python 3.11's asyncio.wait_for,
    under nats-py's requests, drops one that comes as its wait ends), or in a child task of the
    handler's, whose error its task group raises in place of the cancellation.
    """
    # A group holds nothing else when splitting off the sends' errors leaves no rest.
    gone = isinstance(err, STREAM_GONE) or (isinstance(err, BaseExceptionGroup) and err.split(STREAM_GONE)[1] is None)
    task = asyncio.current_task()
    return gone and task is not None and task.cancelling() > 0


def _wrap(
    path: str, owner: str, handler: Handler, *, is_running: IsRunning, inflight: InflightTracker, calls: Any
) -> Handler:
    func = handler.func
    # A streaming call may last as long as its peer stays (a worker's session does): say which it is.
    kind = GRPC_CALL if handler.cardinality is Cardinality.UNARY_UNARY else GRPC_STREAM

    async def gated(stream: Stream[Any, Any]) -> None:
        if not is_running(owner):
            raise GRPCError(Status.UNAVAILABLE, f"served by plugin {owner!r}, which is not running")
        status = "OK"
        with inflight.track(kind):
            try:
                try:
                    await func(stream)
                except NotReady as err:
                    raise GRPCError(Status.UNAVAILABLE, str(err)) from err
                except (*STREAM_GONE, BaseExceptionGroup) as err:
                    if _reset_while_sending(err):
                        raise asyncio.CancelledError from None
                    raise
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
        compression.install()  # clients may compress what they send
        hpack_plain.install()  # every call's response head and trailers
        calls = metrics.counter("grpc_server_handled_total", "gRPC calls handled.", ["method", "code"])
        mapping: dict[str, Handler] = {}
        owners: dict[str, str] = {}
        fallback: tuple[str, Fallback] | None = None
        claims: Claims | None = None
        for owner, servicer in servicers:
            find: Fallback | None = getattr(servicer, "__fallback__", None)
            if find is not None:
                if fallback is not None:
                    raise GrpcServerError(f"both {fallback[0]!r} and {owner!r} want to serve unknown gRPC methods")
                fallback = (owner, find)
                claims = getattr(servicer, "__claims__", None)
            for path, handler in servicer.__mapping__().items():
                if path in mapping:
                    raise GrpcServerError(f"gRPC method {path} is served by both {owners[path]!r} and {owner!r}")
                owners[path] = owner
                mapping[path] = (
                    handler
                    if owner == "host"
                    else _wrap(path, owner, handler, is_running=is_running, inflight=inflight, calls=calls)
                )
        self._server = Server([_Router(mapping)], status_details_codec=_StatusDetails())
        # grpclib's close() cancels the handlers but leaves their connections open, so a peer whose
        # stream just ended unanswered would never notice; the connections are closed after them.
        self._connections: weakref.WeakSet[H2Protocol] = weakref.WeakSet()
        make_protocol = self._server._protocol_factory

        def tracked() -> H2Protocol:
            protocol = make_protocol()
            self._connections.add(protocol)
            return protocol

        self._server._protocol_factory = tracked  # type: ignore[method-assign]
        if fallback is not None:
            owner, find = fallback

            def wrapped(path: str) -> Handler | None:
                handler = find(path)
                if handler is None:
                    return None
                return _wrap(FALLBACK_LABEL, owner, handler, is_running=is_running, inflight=inflight, calls=calls)

            # grpclib copies the servicers' mappings into a plain dict and only ever calls .get() on it.
            self._server._mapping = _Mapping(self._server._mapping, wrapped, claims)
        self.port = 0

    async def start(self, ssl_context: ssl.SSLContext | None = None) -> int:
        """Bind and serve (over TLS with ``ssl_context``, whose ALPN is ``h2``); returns the bound port."""
        try:
            await self._server.start(self._settings.host, self._settings.port, reuse_address=True, ssl=ssl_context)
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
        for protocol in list(self._connections):
            connection = getattr(protocol, "connection", None)
            if connection is not None:
                connection.close()
