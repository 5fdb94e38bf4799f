"""Response frames arriving at the node that holds the client, routed to the waiting request.

Relays send each frame as a bus request to ``nvcf.resp.<inbox>.<requestId>.<capability>`` and wait
for the answer before sending the next (stop-and-wait: frames of a request stay in order, and a
slow client slows the relay down all the way to the inference server). Answers: ``ok``, or ``gone``
when no request waits for the frame (the client left: stop) or the subject's capability is not the
request's. A relay on this node hands frames over directly, without the bus.

The capability is what makes a reply subject unforgeable: workers on the nats transport publish
their frames themselves, and may publish to any response subject, so a frame counts only when its
subject carries the token that came inside the request the worker was given.
"""

from __future__ import annotations

import hmac
import logging
import math
import uuid
from typing import Literal, final

import anyio
from anyio.abc import TaskStatus

from nvcf_mono.auth.secret import Keyring, b64u
from nvcf_mono.bus.api import Bus, Msg
from nvcf_mono.contracts import subjects
from nvcf_mono.contracts.frames import Frame, FrameError
from nvcf_mono.log import Throttle
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
        """Answer relays until cancelled."""
        await self._bus.serve(self.prefix + ">", self._on_frame, concurrency=1024, task_status=task_status)

    async def _on_frame(self, msg: Msg) -> bytes:
        try:
            frame = Frame.decode(msg.data)
        except FrameError as err:
            self._complaints.log(
                self._log, logging.WARNING, "dropping a malformed response frame on %s: %s", msg.subject, err
            )
            return GONE
        request_id, _, capability = msg.subject[len(self.prefix) :].partition(".")
        pending = self._pending.get(frame.request_id)
        if pending is None:
            return GONE  # finished or never here (the usual case for a late frame)
        if request_id != frame.request_id or not _same(pending.capability, capability):
            self._complaints.log(
                self._log, logging.WARNING, "refusing a response frame for %s without its capability", frame.request_id
            )
            return GONE
        return OK if await pending.put(frame) == "ok" else GONE
