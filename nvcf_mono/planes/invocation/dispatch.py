"""Putting requests into their version's durable buffer, and taking them out again (cancel, expiry).

Each version has one request stream (``rq_<region>_<fvid>``) with one durable consumer the
invocation plane pulls for the version's workers; both are created on first use from the specs in
``contracts.streams``, once per process.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterable, Awaitable, Callable
from functools import partial
from typing import final

import anyio

from nvcf_mono.backoff import Backoff
from nvcf_mono.bus.api import Bus
from nvcf_mono.bus.errors import BusError, BusUnavailable, NotFound, RequestTimeout, StreamFull
from nvcf_mono.bus.upload_room import upload_room
from nvcf_mono.config.model import Settings
from nvcf_mono.contracts import buckets, streams, subjects
from nvcf_mono.contracts.frames import Request
from nvcf_mono.http.problem import ProblemError
from nvcf_mono.planes.invocation.config import InvocationConfig
from nvcf_mono.planes.invocation.quota import Admission, QueueQuota

#: Room in a request message besides its inline body: the method, path, headers and ids.
HEADER_ROOM = 1024 * 1024


@final
class Dispatcher:
    """Publishes requests, cancels them, and keeps their large bodies."""

    def __init__(
        self,
        bus: Bus,
        config: InvocationConfig,
        region: str,
        log: logging.Logger,
        *,
        settings: Settings,
        account_of: Callable[[str], str | None] = lambda _version: None,
    ) -> None:
        self._bus = bus
        self._config = config
        self._settings = settings
        self.region = region
        self._log = log
        self._ensured: set[str] = set()
        self.quota = QueueQuota(
            config.queue_max_bytes,
            account_limit=config.account_queue_max_bytes,
            queued=partial(streams.queues, bus, region),
            account_of=account_of,
        )
        self._lock = anyio.Lock()
        #: The room uploads have left in the store, shared with every other upload of this process.
        self.room = upload_room(bus, settings)
        self.payloads = bus.objects(buckets.PAYLOADS.name)
        #: Told of every request stored (function id, version id): the load meter counts and wakes.
        self.on_queued: Callable[[str, str], Awaitable[None]] | None = None

    @property
    def inline_limit(self) -> int:
        """Bodies up to this size travel inside the request message (one stored message, no object store).

        The configured limit, within half of what the message bus takes: the rest is the room for the
        request's headers.
        """
        return min(self._config.inline_body_limit, self._bus.max_payload // 2)

    def stream_name(self, function_version_id: str) -> str:
        return subjects.request_stream(self.region, function_version_id)

    def durable(self, function_version_id: str) -> str:
        return subjects.worker_durable(self.region, function_version_id)

    async def ensure(self, function_version_id: str, *, again: bool = False) -> None:
        """The version's stream and consumer exist (created once per process)."""
        if function_version_id in self._ensured and not again:
            return
        async with self._lock:
            if function_version_id in self._ensured and not again:
                return
            c = self._config
            await self._bus.ensure_stream(
                streams.request_stream(
                    self.region,
                    function_version_id,
                    max_msgs=c.queue_max_messages,
                    max_msg_size=min(self.inline_limit + HEADER_ROOM, self._bus.max_payload),
                    # Outlasts every retry of a publish (they stop after publish_patience).
                    duplicate_window=2 * c.publish_patience,
                )
            )
            await self._bus.stream(self.stream_name(function_version_id)).ensure_consumer(
                streams.request_consumer(self.region, function_version_id, ack_wait=c.ack_wait)
            )
            self._ensured.add(function_version_id)

    def forget(self, function_version_id: str) -> None:
        """The version's stream was removed: make it again on next use, and drop its byte count."""
        self._ensured.discard(function_version_id)
        self.quota.forget(function_version_id)

    async def publish(self, request: Request) -> None:
        """Store the request durably; 429 when the version's queue is full, 503 when the bus will not take it.

        A stream whose leader is being elected (a NATS node lost), a reconnecting connection or a
        stream removed under us is retried until ``publish_patience`` runs out: the message id makes a
        publish that did land the first time a duplicate, never a second request.
        """
        fvid = request.function_version_id
        subject = subjects.request_subject(self.region, fvid, request.request_id)
        data = request.encode()
        stream = self._bus.stream(self.stream_name(fvid))
        patience = self._config.publish_patience
        backoff = Backoff(0.05, 1.0)
        started = time.monotonic()
        admission: Admission | None = None
        again = False
        try:
            while True:
                try:
                    await self.ensure(fvid, again=again)
                    if admission is None:
                        admission = await self.quota.admit(stream, fvid, len(data), account=request.nca_id)
                    ack = await stream.publish(subject, data, msg_id=request.request_id)
                    if not ack.duplicate:  # a duplicate's bytes were counted when it was first stored
                        admission.stored(ack.seq)
                    break
                except StreamFull as err:
                    raise ProblemError(
                        429, "the function's request queue is full; retry later or raise its maxInstances"
                    ) from err
                except (NotFound, BusUnavailable, RequestTimeout) as err:
                    pause = backoff.next()
                    if time.monotonic() - started + pause > patience:
                        self._log.warning("request %s not stored within %gs: %s", request.request_id, patience, err)
                        raise ProblemError(
                            503,
                            f"the request could not be stored: the platform's message bus did not take it within "
                            f"{patience:g}s; it was not run, retry it",
                            headers={"Retry-After": "5"},
                        ) from err
                    again = isinstance(err, NotFound)  # made again only if it is really gone
                    await anyio.sleep(pause)
        finally:
            if admission is not None:
                admission.withdraw()  # not stored (a no-op once it was): its bytes are not on the way any more
        if self.on_queued is not None:
            await self.on_queued(request.function_id, fvid)

    async def put_body(self, request_id: str, chunks: AsyncIterable[bytes]) -> tuple[str, int]:
        """Store a large request body; returns its object name and size.

        It lives as long as its request may wait and run (then it expires on its own); the node that
        gets the request's answer deletes it sooner (:meth:`drop_body`).
        """
        name = buckets.request_body_object(request_id)
        try:
            room = await self.room.left()
        except BusError as err:
            raise ProblemError(503, f"the request could not be stored: {err}", headers={"Retry-After": "1"}) from err
        if room == 0:
            raise _no_room()
        info = await self.payloads.put(
            name, self.room.hold(chunks, _no_room), ttl=self._config.queue_deadline + self._config.result_ttl
        )
        return name, info.size

    async def drop_body(self, name: str | None) -> None:
        """The request has its answer: its stored body is not needed any more (best effort, bounded)."""
        if name is None:
            return
        with anyio.move_on_after(5, shield=True):
            try:
                await self.payloads.delete(name)
            except BusError as err:
                self._log.debug("could not delete request body %s: %s", name, err)

    async def cancel(self, function_version_id: str, request_id: str, *, reason: str = "cancelled") -> None:
        """Take a queued request out and tell the worker serving it to stop (best effort, bounded)."""
        with anyio.move_on_after(10, shield=True):
            try:
                await self._bus.stream(self.stream_name(function_version_id)).purge(
                    subject=subjects.request_subject(self.region, function_version_id, request_id)
                )
            except NotFound:
                pass
            await self._bus.publish(subjects.cancel_subject(function_version_id), request_id.encode())
            self._log.debug("cancelled %s (%s)", request_id, reason)

    async def queue_state(self, function_version_id: str, request_id: str) -> tuple[str, int | None]:
        """``("queued", position)`` while no worker has the request, else ``("running", None)``."""
        stream = self._bus.stream(self.stream_name(function_version_id))
        try:
            stored = await stream.get_last(subjects.request_subject(self.region, function_version_id, request_id))
            if stored is None:
                return "running", None
            consumer = await stream.consumer_info(self.durable(function_version_id))
        except NotFound:
            return "running", None
        if consumer.delivered_stream_seq >= stored.seq:
            return "running", None
        return "queued", max(1, min(stored.seq - consumer.delivered_stream_seq, 1000))


def _no_room() -> ProblemError:
    # A body too large for its message is an upload like asset content: it may not take the store's
    # reserve, which keeps room for every account's queued requests (nvcf_mono.bus.upload_room).
    return ProblemError(
        507,
        "the platform's message store has no room for a body this large now (the rest is kept for "
        "queued requests); retry later or send a smaller body",
    )
