"""Session affinity: the turns of one conversation prefer the instance that served the last one.

An LLM server keeps a conversation's KV cache; sending its next turn to the same instance reuses it.
A request names its conversation with the ``x-multi-turn-session-id`` header (the LLM gateway sets it
from ``prompt_cache_key``, or passes the header a client sent back; any pexec caller may set it). The
invocation node remembers which instance took each conversation's last turn; when a worker session
of this node pulls a turn that another instance of the same version took before, and that instance's
session is on this node, serving and has a free slot, the turn is handed to it. Otherwise whoever
pulled it serves it, and becomes the conversation's instance: affinity is a preference, never a wait.

What this does not do: prefer an instance whose worker is connected to another invocation node (each
node knows its own sessions only).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from nvcf_mono.contracts.frames import Headers

HEADER = "x-multi-turn-session-id"
#: Conversations remembered per node (the oldest go first), and for how long after their last turn.
MAX_SESSIONS = 10_000
TTL = 600.0
#: Longest key kept (a longer one is not a conversation id worth remembering).
MAX_KEY = 256


def session_key(headers: Headers) -> str | None:
    """The conversation a request belongs to, when it says."""
    for name, value in headers:
        if len(name) == len(HEADER) and name.lower() == HEADER:
            value = value.strip()
            return value if 0 < len(value) <= MAX_KEY else None
    return None


class Affinity:
    """Conversation -> the instance that took its last turn, per function version; bounded and expiring."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._last: OrderedDict[tuple[str, str], tuple[str, float]] = OrderedDict()

    def instance_of(self, version_id: str, key: str) -> str | None:
        found = self._last.get((version_id, key))
        if found is None:
            return None
        instance, at = found
        if self._clock() - at > TTL:
            del self._last[(version_id, key)]
            return None
        return instance

    def took(self, version_id: str, key: str, instance_id: str) -> None:
        """``instance_id`` took the conversation's latest turn."""
        entry = (version_id, key)
        self._last[entry] = (instance_id, self._clock())
        self._last.move_to_end(entry)
        while len(self._last) > MAX_SESSIONS:
            self._last.popitem(last=False)

    def __len__(self) -> int:
        return len(self._last)
