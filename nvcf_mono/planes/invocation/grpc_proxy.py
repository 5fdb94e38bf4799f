"""The gRPC proxy: calls to gRPC functions on the host's gRPC port, relayed opaquely through the worker.

Any method of a service the host does not serve comes here (``__fallback__``). The call names its
function with ``function-id`` (+ optional ``function-version-id``) metadata and authenticates with
``authorization: Bearer <key>``, as NVCF's gRPC proxy. The request message(s) become one
invocation ``Request`` (``grpc=True``, path = the gRPC method, body = the length-prefixed messages)
in the version's durable buffer, like pexec; the worker calls the function's gRPC server and its
reply messages come back in response frames, relayed to the client one by one as they arrive, and
the call ends with the function's own status and trailers.

The call waits for the function's first answer until the client's deadline or, without one,
``default_poll_seconds`` (then DEADLINE_EXCEEDED; there is no 202 for gRPC). A client that closes its
side within ``grpc_live_after`` has its whole request stored as the call; one that keeps it open is
dispatched with the messages it sent so far, and the rest is read from this node by whoever serves
the call as the client sends it (full duplex; contracts/live_input.py).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
from collections.abc import Sequence
from functools import partial
from typing import NoReturn, final

import anyio
from grpclib.const import Cardinality, Handler, Status
from grpclib.exceptions import GRPCError, ProtocolError, StreamTerminatedError
from grpclib.metadata import decode_bin_value, encode_timeout
from grpclib.server import Stream

from nvcf_mono.auth import scopes as S
from nvcf_mono.auth.principal import AuthError, Principal
from nvcf_mono.auth.strategy import Authenticator
from nvcf_mono.contracts.frames import Frame, Request
from nvcf_mono.contracts.ids import is_id, shown
from nvcf_mono.grpc.compression import guarded
from nvcf_mono.grpc.raw import (
    DETAILS,
    MESSAGE,
    PREFIX_SIZE,
    STATUS,
    FramingError,
    RawMessage,
    Unpacker,
    metadata_to_pairs,
    pack,
    pairs_to_metadata,
)
from nvcf_mono.http.problem import ProblemError
from nvcf_mono.late import Late
from nvcf_mono.models.common import new_id
from nvcf_mono.models.function import FunctionVersion
from nvcf_mono.planes.invocation.held_input import Hold, TooMuchHeld
from nvcf_mono.planes.invocation.http import Invoker
from nvcf_mono.planes.invocation.intake import new_request, stage
from nvcf_mono.planes.invocation.live_input import InputTooLarge, LiveInput
from nvcf_mono.planes.invocation.responses import Pending

FUNCTION_ID = "function-id"
FUNCTION_VERSION_ID = "function-version-id"
AUTHORIZATION = "authorization"
REQID = "nvcf-reqid"
#: Never forwarded to the function.
DROPPED = frozenset({AUTHORIZATION})

#: HTTP statuses of the platform's errors as gRPC statuses (reference §4.2 and §1.4, read backwards).
_FROM_HTTP = {
    400: Status.INVALID_ARGUMENT,
    401: Status.UNAUTHENTICATED,
    403: Status.PERMISSION_DENIED,
    404: Status.NOT_FOUND,
    408: Status.DEADLINE_EXCEEDED,
    409: Status.ALREADY_EXISTS,
    412: Status.FAILED_PRECONDITION,
    413: Status.RESOURCE_EXHAUSTED,
    429: Status.RESOURCE_EXHAUSTED,
    499: Status.CANCELLED,
    500: Status.INTERNAL,
    501: Status.UNIMPLEMENTED,
    502: Status.UNAVAILABLE,
    503: Status.UNAVAILABLE,
    504: Status.DEADLINE_EXCEEDED,
}


def grpc_status(http_status: int) -> Status:
    """The gRPC status for one of the platform's HTTP error statuses."""
    return _FROM_HTTP.get(http_status, Status.INTERNAL if http_status >= 500 else Status.UNKNOWN)


class _Ended(Exception):
    """The function's answer ended; its status has been sent to the client."""

    def __init__(self, status: Status, message: str | None) -> None:
        super().__init__(status.name)
        self.status = status
        self.message = message


@final
class GrpcProxy:
    """Servicer with no methods of its own and a handler for every unknown one."""

    def __init__(self, log: logging.Logger, *, invoker: Late[Invoker], authenticator: Late[Authenticator]) -> None:
        self._log = log
        self._invoker = invoker
        self._auth = authenticator

    def __mapping__(self) -> dict[str, Handler]:
        return {}

    def __claims__(self, headers: Sequence[tuple[str, str]]) -> bool:
        """A call that names a function is the function's, even on a path the host serves itself: a client
        checking its function with ``grpc.health.v1.Health/Check`` hears from the function, not the platform.
        """
        return any(key == FUNCTION_ID for key, _ in headers)

    def __fallback__(self, path: str) -> Handler:
        # STREAM_STREAM: grpclib then allows any number of messages each way; the function decides.
        return Handler(partial(self._call, path), Cardinality.STREAM_STREAM, RawMessage, RawMessage)

    # ---- one call ------------------------------------------------------------------------------------

    async def _call(self, path: str, stream: Stream[RawMessage, RawMessage]) -> None:
        invoker, auth = self._invoker.get(), self._auth.get()
        # function-id first: a call without it is no function call at all (perhaps a mistyped method).
        function_id = _metadata(stream, FUNCTION_ID).strip()
        if not function_id:
            raise GRPCError(
                Status.INVALID_ARGUMENT,
                f"'{FUNCTION_ID}' metadata is required: the id of the function to call ({path} is not a method of "
                "this host)",
            )
        principal = await self._authenticate(auth, _metadata(stream, AUTHORIZATION))
        version_id = _metadata(stream, FUNCTION_VERSION_ID).strip() or None
        for name, value in ((FUNCTION_ID, function_id), (FUNCTION_VERSION_ID, version_id)):
            if value is not None and not is_id(value):
                raise GRPCError(Status.INVALID_ARGUMENT, f"'{name}' metadata is not a valid id: {shown(value)!r}")
        try:
            principal.require(S.INVOKE_FUNCTION)
            fv = await invoker.routing.resolve_current(principal, function_id, version_id)
            if not fv.is_grpc:
                raise GRPCError(
                    Status.INVALID_ARGUMENT,
                    f"function '{function_id}' is not a gRPC function (its inferenceUrl is not /grpc): "
                    "invoke it over HTTP with pexec",
                )
            await invoker.limiter.admit(principal, fv)
        except (AuthError, ProblemError) as err:
            raise GRPCError(grpc_status(err.status), err.detail) from None
        window = (
            stream.deadline.time_remaining() if stream.deadline is not None else invoker.config.default_poll_seconds
        )
        if window <= 0:
            raise GRPCError(Status.DEADLINE_EXCEEDED, "the call's deadline passed before it was dispatched")
        limit = invoker.config.max_request_body
        try:
            hold = invoker.held.hold(principal.account)  # one of the account's calls in flight here
        except TooMuchHeld as err:
            raise GRPCError(Status.RESOURCE_EXHAUSTED, err.detail) from None
        # The client's messages count towards its account's input held on this node while the call lasts
        # (a live call's, until its function has read them), each before its bytes are read.
        with hold, guarded(partial(_admit_message, hold, limit)):
            if _client_closed(stream):
                # The usual unary or server-streaming call: its messages are all here, and it is stored whole.
                body = await _read_all(stream, limit)
                await self._invoke(stream, invoker, principal, fv, path=path, body=body, window=window, live=None)
                return
            await self._call_open(stream, invoker, principal, fv, path=path, window=window, hold=hold)

    async def _call_open(
        self,
        stream: Stream[RawMessage, RawMessage],
        invoker: Invoker,
        principal: Principal,
        fv: FunctionVersion,
        *,
        path: str,
        window: float,
        hold: Hold,
    ) -> None:
        """A call whose client has not closed its side yet: stored whole if it does within ``grpc_live_after``,
        else started live.
        """
        live = LiveInput(invoker.config.max_request_body, hold=hold)
        too_large: InputTooLarge | None = None
        failure: Exception | None = None
        async with anyio.create_task_group() as tg:

            async def read_client() -> None:
                nonlocal too_large
                try:
                    await _read_client(stream, live)
                except InputTooLarge as err:
                    too_large = err
                    tg.cancel_scope.cancel()

            tg.start_soon(read_client)
            # A client that closes its side at once (unary, server streaming) is stored whole: durable, and
            # served again elsewhere should an instance fail; one that keeps it open is served as it sends.
            ended = await live.wait_end(invoker.config.grpc_live_after)
            body = live.take()
            try:
                await self._invoke(
                    stream, invoker, principal, fv, path=path, body=body, window=window, live=None if ended else live
                )
            except Exception as err:  # raised after the task group, as itself (not in an exception group)
                failure = err
            tg.cancel_scope.cancel()  # the function ended the call: whatever the client still sends is not wanted
        if too_large is not None:
            raise GRPCError(Status.RESOURCE_EXHAUSTED, str(too_large))
        if failure is not None:
            raise failure

    async def _authenticate(self, auth: Authenticator, header: str) -> Principal:
        if not header.strip():
            raise GRPCError(Status.UNAUTHENTICATED, "'authorization: Bearer <key>' metadata is required")
        try:
            return await auth.authenticate(header)
        except AuthError as err:
            raise GRPCError(Status.UNAUTHENTICATED, err.detail) from None

    async def _invoke(
        self,
        stream: Stream[RawMessage, RawMessage],
        invoker: Invoker,
        principal: Principal,
        fv: FunctionVersion,
        *,
        path: str,
        body: bytes,
        window: float,
        live: LiveInput | None,
    ) -> None:
        request_id = new_id()
        headers = metadata_to_pairs((stream.metadata or {}).items(), drop=DROPPED)
        if stream.deadline is not None:
            # The worker gives the function what is left of the client's deadline.
            headers = [*headers, ("grpc-timeout", encode_timeout(window))]
        staged = await stage(invoker.dispatcher, invoker.dispatcher.inline_limit, request_id, body)
        pending = invoker.router.register(request_id, fv.version_id)
        pending.input = live
        req = new_request(
            principal,
            fv,
            request_id=request_id,
            reply=pending.reply,
            method="POST",
            path=path,
            headers=headers,
            body=staged,
            # Nobody waits for the answer after the window: a request not started by then is dropped.
            window=window,
            poll_seconds=max(1, math.ceil(window)),
            region=invoker.dispatcher.region,
            grpc=True,
            live_input=live is not None,
        )
        ended: _Ended | None = None
        cancelled = False

        async def cancel(reason: str) -> None:
            # Out of the queue and the worker told to stop (once).
            nonlocal cancelled
            if not cancelled:
                cancelled = True
                await invoker.dispatcher.cancel(fv.version_id, request_id, reason=reason)

        try:
            try:
                await invoker.dispatcher.publish(req)
            except ProblemError as err:
                raise GRPCError(grpc_status(err.status), err.detail) from None
            await self._relay(stream, invoker, pending, req, window=window)
        except _Ended as end:
            ended = end
        except GRPCError as err:
            # The platform's own error about this request: settled before the client hears of it,
            # and with the request id to quote.
            await cancel(f"the gRPC proxy gave up: {err.message}")
            with contextlib.suppress(ProtocolError, StreamTerminatedError, OSError):
                await stream.send_trailing_metadata(
                    status=err.status, status_message=err.message, metadata=[(REQID, request_id)]
                )
            raise
        finally:
            if ended is None:
                await cancel("the gRPC call ended early (the client went away)")
            invoker.router.forget(request_id)
            await invoker.dispatcher.drop_body(staged.object_name)
        if ended.status is not Status.OK:
            # Already sent to the client; raised so the call is counted with the function's status.
            raise GRPCError(ended.status, ended.message)

    async def _relay(
        self,
        stream: Stream[RawMessage, RawMessage],
        invoker: Invoker,
        pending: Pending,
        req: Request,
        *,
        window: float,
    ) -> NoReturn:
        """The function's answer to the client, message by message; raises _Ended at its end."""
        try:
            first = await pending.next(timeout=window)
        except TimeoutError:
            if pending.input is None or not pending.input.started:
                raise GRPCError(
                    Status.DEADLINE_EXCEEDED,
                    f"no instance of function '{req.function_id}' answered within {window:.3g}s",
                ) from None
            # A live call an instance serves may answer only once the client has said enough.
            first = await _next_frame(pending, stream, invoker)
        if pending.input is not None:
            pending.input.answered()  # the call stays with this attempt: its input need not be replayable
        if first.problem is not None:
            raise GRPCError(grpc_status(first.problem.status), first.problem.detail)
        if first.status != 200:
            # The worker's own error (problem+json), e.g. the inference server could not be reached.
            raise GRPCError(grpc_status(first.status or 500), _detail(first))
        unpacker = Unpacker()
        received = 0
        frame, expected = first, first.seq
        sent_head = False
        while True:
            if frame.problem is not None:
                raise GRPCError(grpc_status(frame.problem.status), f"the answer broke off: {frame.problem.detail}")
            if frame.seq != expected or frame.attempt != first.attempt:
                raise GRPCError(
                    Status.DATA_LOSS, f"response frame {frame.seq} (attempt {frame.attempt}) where {expected} was due"
                )
            received += len(frame.body)
            try:
                messages = unpacker.feed(frame.body)
            except FramingError as err:
                raise GRPCError(Status.INTERNAL, f"the function's answer is not gRPC: {err}") from None
            if not sent_head and (messages or not frame.last):
                head = pairs_to_metadata(first.headers)
                await stream.send_initial_metadata(metadata=[*head, (REQID, req.request_id)])
                sent_head = True
            for message in messages:
                await stream.send_message(RawMessage(message))
            if frame.last:
                if frame.total_length is not None and frame.total_length != received:
                    raise GRPCError(Status.DATA_LOSS, f"{received} bytes of the answer arrived of {frame.total_length}")
                if unpacker.buffered:
                    raise GRPCError(Status.DATA_LOSS, "the answer ended inside a message")
                status, text = await _send_status(stream, frame, with_reqid=None if sent_head else req.request_id)
                raise _Ended(status, text)
            expected += 1
            frame = await _next_frame(pending, stream, invoker)


async def _next_frame(pending: Pending, stream: Stream[RawMessage, RawMessage], invoker: Invoker) -> Frame:
    """The answer's next frame, within the client's deadline (without one, ``queue_deadline``)."""
    remaining = stream.deadline.time_remaining() if stream.deadline is not None else invoker.config.queue_deadline
    try:
        return await pending.next(timeout=max(remaining, 0.0))
    except TimeoutError:
        raise GRPCError(Status.DEADLINE_EXCEEDED, "the function's answer did not finish in time") from None


async def _send_status(
    stream: Stream[RawMessage, RawMessage], frame: Frame, *, with_reqid: str | None
) -> tuple[Status, str | None]:
    """The function's status and trailing metadata (with the request id when no header was sent)."""
    trailers = {k.lower(): v for k, v in frame.trailers}
    try:
        status = Status(int(trailers.get(STATUS, "")))
    except ValueError:
        status = Status.UNKNOWN
        trailers[MESSAGE] = trailers.get(MESSAGE) or "the function's answer carried no valid grpc-status"
    details: bytes | None = None
    if DETAILS in trailers:
        try:
            details = decode_bin_value(trailers[DETAILS].encode("ascii"))
        except (ValueError, UnicodeEncodeError):
            details = None
    metadata = pairs_to_metadata(frame.trailers)
    if with_reqid is not None:
        metadata.append((REQID, with_reqid))
    message = trailers.get(MESSAGE) if status is not Status.OK else None
    await stream.send_trailing_metadata(
        status=status,
        status_message=message,
        status_details=details if status is not Status.OK else None,
        metadata=metadata,
    )
    return status, message


def _detail(frame: Frame) -> str:
    """The ``detail`` of a problem+json answer, else a word about the status."""
    try:
        doc = json.loads(frame.body)
    except ValueError:
        doc = None
    if isinstance(doc, dict) and isinstance(doc.get("detail"), str):
        return str(doc["detail"])
    return f"the function's instance answered HTTP status {frame.status}"


def _client_closed(stream: Stream[RawMessage, RawMessage]) -> bool:
    """Whether the client's side has ended already (its messages can all be read without waiting).

    Reads grpclib 0.4's stream buffer; where that is not there, the answer is no (the general path).
    """
    buffer = getattr(getattr(stream, "_stream", None), "buffer", None)
    return getattr(buffer, "_eof", False) is True


def _admit_message(hold: Hold, limit: int, size: int) -> None:
    """A client message's size (prefix included), before its bytes are read: within the call's limit, and
    counted towards its account's input held on this node.
    """
    if size > limit + PREFIX_SIZE:
        raise InputTooLarge(f"the request exceeds the limit of {limit} bytes (a message of {size - PREFIX_SIZE} bytes)")
    try:
        hold.take(size)
    except TooMuchHeld as err:
        raise InputTooLarge(err.detail) from None


async def _read_all(stream: Stream[RawMessage, RawMessage], limit: int) -> bytes:
    """The client's messages, length-prefixed, all of them (within ``limit`` bytes)."""
    messages: list[bytes] = []
    size = 0
    try:
        while (message := await stream.recv_message()) is not None:
            size += len(message.data)
            if size > limit:
                raise InputTooLarge(f"the request exceeds the limit of {limit} bytes")
            messages.append(message.data)
    except InputTooLarge as err:
        raise GRPCError(Status.RESOURCE_EXHAUSTED, str(err)) from None
    return pack(messages)


async def _read_client(stream: Stream[RawMessage, RawMessage], live: LiveInput) -> None:
    """The client's messages into ``live``, length-prefixed, until it closes its side (or goes away)."""
    try:
        while (message := await stream.recv_message()) is not None:
            await live.append(pack([message.data]))
    except (StreamTerminatedError, ProtocolError):
        return  # the client went away; the call ends with it
    live.end()


def _metadata(stream: Stream[RawMessage, RawMessage], key: str) -> str:
    value = stream.metadata.get(key) if stream.metadata is not None else None
    return value if isinstance(value, str) else ""
