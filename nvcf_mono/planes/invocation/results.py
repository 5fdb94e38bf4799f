"""Durable state of requests that outlive their poll window: where they are, and their results.

A request that answered 202 gets a record in ``nvcf_requests``; whoever ends up with its response
(the node that accepted it, or the relay when that node is gone) stores it in ``nvcf_results`` (the
body inline, or in ``nvcf_payloads`` when large), so a status poll on any node finds it. Fetching
a finished result removes it: the next poll answers 404, as NVCF does.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import AsyncIterable, AsyncIterator
from typing import final

import anyio

from nvcf_mono.backoff import Backoff
from nvcf_mono.bus.api import Bus
from nvcf_mono.bus.codec import TypedKV
from nvcf_mono.bus.errors import BusError, BusUnavailable, ConflictError, NotFound, RequestTimeout, StoreFull
from nvcf_mono.bus.upload_room import upload_room
from nvcf_mono.config.model import Settings
from nvcf_mono.contracts import buckets
from nvcf_mono.contracts.buckets import RequestRecord, StoredResult
from nvcf_mono.contracts.frames import Frame, Headers
from nvcf_mono.contracts.problems import PROBLEM_CONTENT_TYPE, problem_body
from nvcf_mono.models.common import now_iso
from nvcf_mono.planes.invocation.result_waits import ResultWaits
from nvcf_mono.structure import evolve

INLINE_RESULT = 512 * 1024
#: Seconds a result waits for room in a full store (or for the bus to take it) before it is given up.
STORE_FULL_PATIENCE = 60.0
_NO_ROOM = (
    "the function answered, but its answer was too large to keep while the platform's store was full; "
    "invoke again once the store has room"
)

QUEUED, RUNNING, DONE = "queued", "running", "done"


def is_progress(result: StoredResult) -> bool:
    """A progress report (202 with a percentage), not the request's result."""
    return result.status == 202 and result.percent is not None


@final
class ResultStore:
    """Records and results of detached requests."""

    def __init__(self, bus: Bus, *, result_ttl: float, log: logging.Logger, settings: Settings) -> None:
        self._bus = bus
        self._room = upload_room(bus, settings)
        self._ttl = result_ttl
        self._log = log
        self.records = TypedKV(bus.kv(buckets.REQUESTS.name), buckets.REQUEST)
        self.results = TypedKV(bus.kv(buckets.RESULTS.name), buckets.RESULT)
        self.payloads = bus.objects(buckets.PAYLOADS.name)
        #: Wakes status polls when their result is written (run it in the plane's task group).
        self.waits = ResultWaits(bus, buckets.RESULTS.name, log)

    async def track(self, record: RequestRecord, *, ttl: float) -> None:
        """Remember a request that answered 202 (until its deadline plus the result TTL)."""
        await self.records.put(record.request_id, record, ttl=ttl)

    async def record(self, request_id: str) -> RequestRecord | None:
        found = await self.records.get(request_id)
        return None if found is None else found.value

    async def store(
        self,
        request_id: str,
        status: int,
        headers: Headers,
        body: bytes | AsyncIterable[bytes],
        *,
        percent: int | None = None,
    ) -> None:
        """Keep a finished response for ``result_ttl``."""
        if isinstance(body, bytes) and len(body) <= INLINE_RESULT:
            result = StoredResult(
                request_id=request_id,
                status=status,
                headers=headers,
                finished_at=now_iso(),
                body=base64.b64encode(body).decode(),
                body_size=len(body),
                percent=percent,
            )
        else:
            name = buckets.result_body_object(request_id)
            try:
                # A large result is kept like an upload: never in the store's reserve (nvcf_mono.bus.upload_room),
                # or one account's results could fill the store for everyone.
                body = self._room.hold(body, lambda: StoreFull("no room left for uploads"))
                info = await self.payloads.put(name, body, ttl=self._ttl)
            except StoreFull:
                # Its caller gets an answer that says so, rather than none.
                self._log.warning("the store is full: the large result of %s is replaced by a 507", request_id)
                await self.store_problem(request_id, 507, _NO_ROOM)
                return
            result = StoredResult(
                request_id=request_id,
                status=status,
                headers=headers,
                finished_at=now_iso(),
                body_object=name,
                body_size=info.size,
                percent=percent,
            )
        await self._put(request_id, result)
        record = await self.records.get(request_id)
        if record is not None:
            await self.records.put(request_id, evolve(record.value, state=DONE), ttl=self._ttl)

    async def _put(self, request_id: str, result: StoredResult) -> None:
        """Write a result, waiting out for a while what passes.

        A full store (queued requests drain and free it), a put that timed out under load or while
        the bus reconnects. Writing it twice is harmless: the key holds one result.
        """
        backoff = Backoff(0.5, 5.0)
        last: BusError | None = None
        with anyio.move_on_after(STORE_FULL_PATIENCE):
            while True:
                try:
                    await self.results.put(request_id, result, ttl=self._ttl)
                    return
                except (StoreFull, RequestTimeout, BusUnavailable) as err:
                    last = err
                    self._log.info("the result of %s is not stored yet (%s); trying again", request_id, err)
                    await anyio.sleep(backoff.next())
        if isinstance(last, StoreFull):
            raise StoreFull(f"no room for the result of {request_id} within {STORE_FULL_PATIENCE:g}s")
        raise BusUnavailable(f"the result of {request_id} could not be stored within {STORE_FULL_PATIENCE:g}s: {last}")

    async def store_frames(self, first: Frame, rest: AsyncIterator[Frame]) -> None:
        """Store a response given as frames (first frame in hand): the result, or its problem."""
        if first.problem is not None:
            await self.store_problem(first.request_id, first.problem.status, first.problem.detail)
            return
        chunks = [first.body]
        size = len(first.body)
        last = first
        while not last.last:
            last = await anext(rest)
            if last.problem is not None:
                await self.store_problem(first.request_id, 502, f"the response broke off: {last.problem.detail}")
                return
            chunks.append(last.body)
            size += len(last.body)
        body = b"".join(chunks)
        await self.store(first.request_id, first.status or 200, first.headers, body, percent=first.percent)

    async def progress(self, frame: Frame) -> None:
        """A running request's progress report (a 202 frame): the next status poll answers it once."""
        result = StoredResult(
            request_id=frame.request_id,
            status=202,
            headers=frame.headers,
            finished_at=now_iso(),
            body=base64.b64encode(frame.body).decode(),
            body_size=len(frame.body),
            percent=frame.percent,
        )
        await self._put(frame.request_id, result)

    async def store_problem(self, request_id: str, status: int, detail: str) -> None:
        """A problem+json result (a 504 past the deadline, a 500 after too many deliveries)."""
        body = json.dumps(problem_body(status, detail)).encode()
        await self.store(request_id, status, (("Content-Type", PROBLEM_CONTENT_TYPE),), body)

    async def peek(self, request_id: str) -> StoredResult | None:
        """The stored result, left where it is (None while there is none)."""
        found = await self.results.get(request_id)
        return None if found is None else found.value

    async def take(self, request_id: str) -> tuple[StoredResult, bytes | AsyncIterator[bytes]] | None:
        """The stored result, removed so the next poll says 404 (None while there is none)."""
        found = await self.results.get(request_id)
        if found is None:
            return None
        result = found.value
        if is_progress(result):
            # Shown once; the request stays known, and the next poll waits for what comes next.
            try:
                await self.results.delete(request_id, revision=found.revision)
            except ConflictError:
                pass  # replaced meanwhile (the result, or newer progress): the next poll gets that
            return result, base64.b64decode(result.body)
        await self.results.delete(request_id)
        await self._forget_record(request_id)
        if result.body_object is None:
            return result, base64.b64decode(result.body)
        return result, self._stream(result.body_object)

    async def _stream(self, name: str) -> AsyncIterator[bytes]:
        try:
            async with self.payloads.open(name) as reader:
                async for chunk in reader:
                    yield chunk
        finally:
            with anyio.move_on_after(5, shield=True):
                try:
                    await self.payloads.delete(name)
                except BusError:
                    pass

    async def _forget_record(self, request_id: str) -> None:
        # A record left behind would keep the next poll waiting out its window for a result already
        # fetched: a store that answers late is asked again (a delete that landed unanswered: NotFound).
        backoff = Backoff(0.2, 1.0)
        for attempt in range(3):
            try:
                await self.records.delete(request_id)
                return
            except NotFound:
                return
            except BusError as err:
                if attempt == 2:
                    self._log.warning("could not forget request %s: %s", request_id, err)
                    return
                await anyio.sleep(backoff.next())

    async def wait(self, request_id: str, timeout: float) -> bool:
        """Wait up to ``timeout`` for the result to exist; True also once the request is no longer known
        (another poll fetched its result meanwhile: this one answers 404 at once, not at the window's end).
        """

        async def present() -> bool:
            return await self.results.get(request_id) is not None or await self.records.get(request_id) is None

        return await self.waits.wait(request_id, timeout, present)
