"""Response frames arriving at the node that holds the client, routed to the waiting request.

Relays send each frame as a bus request to ``nvcf.resp.<inbox>.<requestId>.<capability>`` and wait
for the answer before sending the next (stop-and-wait: frames of a request stay in order, and a
slow client slows the relay down all the way to the inference server). Answers: ``ok``, or ``gone``
when no request waits for the frame (the client left: stop) or the subject's capability is not the
request's. A relay on this node hands frames over directly, without the bus.

The same node answers questions for a live gRPC call's later client messages on the twin subject
``nvcf.input.<inbox>.<requestId>.<capability>`` (contracts/live_input.py), with the same check.

The capability is what makes a reply subject unforgeable: workers on the nats transport publish
their frames themselves, and may publish to any response subject, so a frame counts only when its
subject carries the token that came inside the request the worker was given.
"""

from __future__ import annotations

import hmac
import logging
import math
import uuid
from functools import partial
from typing import Literal, final

import anyio
from anyio.abc import TaskStatus

from nvcf_mono.auth.secret import Keyring, b64u
from nvcf_mono.bus.api import Bus, Msg
from nvcf_mono.contracts import live_input, subjects
from nvcf_mono.contracts.frames import Frame, FrameError
from nvcf_mono.log import Throttle
from nvcf_mono.planes.invocation.live_input import LiveInput
from nvcf_mono.queues import Mailbox

Verdict = Literal["ok", "gone"]
OK, GONE = b"ok", b"gone"


def _same(expected: str, given: str) -> bool:
    """Constant-time comparison that any string may reach (compare_digest refuses non-ASCII str)."""
    return hmac.compare_digest(expected.encode(), given.encode(errors="replace"))


@final
class Capabilities:
    """Per-request capabilities: a MAC of the version and request id under a key every node shares.

    Any invocation node can check one (the node that stores an orphaned response is not the one
    that issued it), and one request's capability says nothing about another's.
    """

    def __init__(self, key: bytes) -> None:
        self._key = key

    @classmethod
    def of_keyring(cls, keyring: Keyring) -> Capabilities:
        return cls(keyring.secret.derive("response-capabilities/v1"))

    def of(self, function_version_id: str, request_id: str) -> str:
        mac = hmac.digest(self._key, f"{function_version_id}/{request_id}".encode(), "sha256")
        return b64u(mac[:16])  # 128 bits, one subject token (base64url has no '.', '*' or '>')

    def holds(self, function_version_id: str, request_id: str, capability: str) -> bool:
        """Whether ``capability`` is the one of this request."""
        return bool(capability) and _same(self.of(function_version_id, request_id), capability)


@final
class Pending:
    """One request waiting for its response frames (bounded: a full queue holds the relay back)."""

    def __init__(
        self, request_id: str, function_version_id: str, capability: str, *, reply: str = "", capacity: int = 16
    ) -> None:
        self.request_id = request_id
        self.function_version_id = function_version_id
        self.capability = capability
        #: The subject the request's frames are sent to.
        self.reply = reply
        self._frames: Mailbox[Frame] = Mailbox(capacity)
        #: The client got a 202: whoever holds this stores the result.
        self.detached = False
        #: A live gRPC call: the client's later messages, for its server to read.
        self.input: LiveInput | None = None

    @property
    def closed(self) -> bool:
        return self._frames.closed

    @property
    def queued(self) -> int:
        """Frames that arrived and were not taken yet."""
        return len(self._frames)

    async def put(self, frame: Frame) -> Verdict:
        return "ok" if await self._frames.put(frame) else "gone"

    async def next(self, timeout: float = math.inf) -> Frame:
        """The next frame; TimeoutError after ``timeout`` seconds."""
        return await self._frames.get(timeout)

    def close(self) -> None:
        self._frames.close()
        if self.input is not None:
            self.input.close()


@final
class ResponseRouter:
    """Receives frames for this node's requests."""

    def __init__(self, bus: Bus, node: str, log: logging.Logger, capabilities: Capabilities) -> None:
        self._bus = bus
        self._log = log
        #: Frames nobody sends but a hostile worker (their subjects are open to every worker): a few lines.
        self._complaints = Throttle()
        self._capabilities = capabilities
        # A fresh inbox per process: a restarted node never receives its predecessor's frames.
        self.inbox = f"{node}-{uuid.uuid4().hex[:8]}"
        self.prefix = subjects.response_prefix(self.inbox) + "."
        self.input_prefix = subjects.input_prefix(self.inbox) + "."
        self._pending: dict[str, Pending] = {}

    def is_local(self, reply_subject: str) -> bool:
        return reply_subject.startswith(self.prefix)

    def register(self, request_id: str, function_version_id: str) -> Pending:
        """A request waits for its frames here; its reply subject (``pending.reply``) carries its capability."""
        capability = self._capabilities.of(function_version_id, request_id)
        reply = subjects.response_subject(self.inbox, request_id, capability)
        pending = Pending(request_id, function_version_id, capability, reply=reply)
        self._pending[request_id] = pending
        return pending

    def forget(self, request_id: str) -> None:
        pending = self._pending.pop(request_id, None)
        if pending is not None:
            pending.close()

    def __len__(self) -> int:
        return len(self._pending)

    async def deliver(self, frame: Frame) -> Verdict:
        """Hand a frame to its request on this node."""
        pending = self._pending.get(frame.request_id)
        if pending is None:
            return "gone"
        return await pending.put(frame)

    async def serve(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Answer relays (and questions for live input) until cancelled."""
        async with anyio.create_task_group() as tg:
            await tg.start(partial(self._bus.serve, self.prefix + ">", self._on_frame, concurrency=1024))
            # A question may wait (live_input.HOLD_SECONDS) for the client: one task each, one per live call.
            await tg.start(partial(self._bus.serve, self.input_prefix + ">", self._on_input, concurrency=4096))
            task_status.started()

    def _holder(self, subject: str, prefix: str, request_id: str) -> Pending | None:
        """The request waiting here that ``subject`` (``<prefix><requestId>.<capability>``) names with its
        capability; None (quietly) when none waits, and with a complaint when the capability is wrong.
        """
        named, _, capability = subject[len(prefix) :].partition(".")
        pending = self._pending.get(request_id)
        if pending is None:
            return None  # finished or never here (the usual case for a late frame)
        if named != request_id or not _same(pending.capability, capability):
            self._complaints.log(
                self._log, logging.WARNING, "refusing a message for request %s without its capability", request_id
            )
            return None
        return pending

    async def read_input(self, request_id: str, offset: int) -> bytes:
        """A question for the live input of a request waiting here, asked on this node."""
        pending = self._pending.get(request_id)
        if pending is None or pending.input is None:
            return live_input.answer(live_input.GONE)
        return await pending.input.read(offset)

    async def _on_input(self, msg: Msg) -> bytes:
        request_id = msg.subject[len(self.input_prefix) :].partition(".")[0]
        offset = live_input.parse_question(msg.data)
        if offset is None or self._holder(msg.subject, self.input_prefix, request_id) is None:
            return live_input.answer(live_input.GONE)
        return await self.read_input(request_id, offset)

    async def _on_frame(self, msg: Msg) -> bytes:
        try:
            frame = Frame.decode(msg.data)
        except FrameError as err:
            self._complaints.log(
                self._log, logging.WARNING, "dropping a malformed response frame on %s: %s", msg.subject, err
            )
            return GONE
        pending = self._holder(msg.subject, self.prefix, frame.request_id)
        if pending is None:
            return GONE
        return OK if await pending.put(frame) == "ok" else GONE
