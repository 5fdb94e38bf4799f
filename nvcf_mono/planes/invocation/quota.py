"""Each version's queued bytes, held to ``queue_max_bytes`` by the platform rather than by JetStream.

A JetStream byte limit reserves its whole size out of the server's store when the stream is made,
so it cannot be the per-version limit of a platform with thousands of versions. Instead each node
keeps, per version, the stream's size at its last look plus what it published since: far below
the limit a publish costs no call at all; past half of it the node looks again (at most every
``REFRESH`` seconds) and refuses what would not fit. Several nodes may together overshoot by what
each published since its last look, which is bounded by the refresh period.
"""

from __future__ import annotations

import time
from typing import final

import attrs

from nvcf_mono.bus.api import Stream
from nvcf_mono.bus.errors import NotFound
from nvcf_mono.http.problem import ProblemError

#: Least seconds between two looks at one version's stream size.
REFRESH = 0.25


@attrs.define
class _Seen:
    stored: int = 0
    published: int = 0
    at: float = -REFRESH


@final
class QueueQuota:
    """Per version: bytes in its request stream, as far as this node knows."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._seen: dict[str, _Seen] = {}

    def __len__(self) -> int:
        return len(self._seen)

    async def admit(self, stream: Stream, function_version_id: str, size: int) -> None:
        """Count ``size`` more bytes for the version, or raise 429 when its queue would exceed the limit."""
        seen = self._seen.get(function_version_id)
        if seen is None:
            seen = self._seen[function_version_id] = _Seen()
        estimate = seen.stored + seen.published + size
        now = time.monotonic()
        if estimate > self.limit // 2 and now - seen.at >= REFRESH:
            try:
                seen.stored = (await stream.info()).bytes
            except NotFound:
                seen.stored = 0
            seen.published, seen.at = 0, now
            estimate = seen.stored + size
        if estimate > self.limit:
            raise ProblemError(
                429,
                f"the function's request queue is full ({seen.stored + seen.published} bytes queued, limit "
                f"{self.limit}); retry later, or raise its maxInstances so it drains faster",
                headers={"Retry-After": "5"},
            )
        seen.published += size

    def forget(self, function_version_id: str) -> None:
        """The version's queue is gone."""
        self._seen.pop(function_version_id, None)
