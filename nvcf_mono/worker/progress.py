"""Progress reports: the reference's progress file turned into 202 frames while a request runs.

An inference server that wants its caller to see progress writes ``<NVCF-LARGE-OUTPUT-DIR>/progress``
as ``{"id": <request id>, "progress": 0-100, "partialResponse": {...}}``. Until the response itself
starts, each new report becomes a frame with status 202, ``percent`` and the partial response as
its JSON body; the invocation node answers the waiting client (or the next status poll) with it.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Awaitable, Callable
from typing import final

import anyio

from nvcf_mono.contracts.frames import Frame

PROGRESS_FILE = "progress"

log = logging.getLogger("nvcf_mono.worker")


@final
class ProgressReports:
    """One request's progress file (looked at by the monitor; ``close`` when the response starts)."""

    def __init__(self, request_id: str, attempt: int, path: str) -> None:
        self.request_id = request_id
        self.attempt = attempt
        self.path = path
        #: Frames sent so far: the response's frames are numbered after them.
        self.sent = 0
        self._closed = False
        #: Set while a report is being sent (close waits for it; no lock: most requests never report).
        self._sending: anyio.Event | None = None
        self._stamp: tuple[int, int] | None = None
        self._last: tuple[int, bytes] | None = None

    async def poll(self, answer: Callable[[Frame], Awaitable[None]]) -> None:
        """Send a frame if the file holds a new report (nothing once closed)."""
        if self._closed:
            return
        frame = self.read()
        if frame is None:
            return
        sending = self._sending = anyio.Event()
        try:
            await answer(frame)
            self.sent += 1
        finally:
            self._sending = None
            sending.set()

    async def close(self) -> int:
        """No more reports (the response starts); returns how many were sent."""
        self._closed = True
        if self._sending is not None:
            await self._sending.wait()  # a report on its way is numbered before the response
        return self.sent

    def read(self) -> Frame | None:
        """A frame for a new report in the file, else None."""
        try:
            stat = os.stat(self.path)
        except OSError:
            return None
        stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp == self._stamp:
            return None
        try:
            with open(self.path, "rb") as f:
                doc = json.loads(f.read())
        except (OSError, ValueError):
            return None  # half written: read again next time
        self._stamp = stamp
        if not isinstance(doc, dict) or doc.get("id") != self.request_id:
            log.debug("request %s: ignoring %s: not this request's progress", self.request_id, self.path)
            return None
        value = doc.get("progress")
        if isinstance(value, bool) or not isinstance(value, int | float):
            log.debug("request %s: ignoring %s: no progress number", self.request_id, self.path)
            return None
        percent = max(0, min(100, int(value)))
        body = json.dumps(doc.get("partialResponse") or {}, separators=(",", ":")).encode()
        if (percent, body) == self._last:
            return None
        self._last = (percent, body)
        return Frame(
            request_id=self.request_id,
            seq=self.sent,
            attempt=self.attempt,
            status=202,
            headers=(("Content-Type", "application/json"),),
            body=body,
            percent=percent,
        )


@final
class ProgressMonitor:
    """One task looks at the progress files of every request that has not answered yet.

    A request costs a registration, not a task: most answer before the first look.
    """

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._watched: dict[str, tuple[ProgressReports, Callable[[Frame], Awaitable[None]]]] = {}

    def watch(self, reports: ProgressReports, answer: Callable[[Frame], Awaitable[None]]) -> None:
        self._watched[reports.request_id] = (reports, answer)

    def drop(self, request_id: str) -> None:
        self._watched.pop(request_id, None)

    def __len__(self) -> int:
        return len(self._watched)

    async def run(self) -> None:
        while True:
            await anyio.sleep(self.interval)
            for reports, answer in list(self._watched.values()):
                try:
                    await reports.poll(answer)
                except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                    self.drop(reports.request_id)  # its session is gone
