"""Session affinity: the turns of one conversation prefer the instance that served the last one.

An LLM server keeps a conversation's KV cache; sending its next turn to the same instance reuses it.
A request names its conversation with the ``x-multi-turn-session-id`` header (the LLM gateway sets it
from ``prompt_cache_key``, or passes the header a client sent back; any pexec caller may set it). Every
invocation node remembers which instance took each conversation's last turn, and on which node that
instance's worker is connected (nodes tell each other: :mod:`.handover`). When a worker session pulls
a turn that another instance of the same version took before, the turn is handed to that instance if
it is serving and has a free slot, on this node directly or through its node. Otherwise whoever pulled
it serves it, and becomes the conversation's instance: affinity is a preference, never a wait.
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from typing import NamedTuple

from nvcf_mono.contracts.frames import Request

HEADER = "x-multi-turn-session-id"
#: Conversations remembered per node (the oldest go first), and for how long after their last turn.
MAX_SESSIONS = 10_000
TTL = 600.0
#: A node tells the others again about a conversation that stays on its instance this often, so their
#: entries do not expire while it goes on (and a lost announcement is mended).
REANNOUNCE = TTL / 4
#: Longest key kept (a longer one is not a conversation id worth remembering).
MAX_KEY = 256
#: How the LLM gateway names a conversation for a call that named none. Most such calls are never
#: continued, so their first turns are kept in a table of their own: a flood of one-off calls cannot
#: push out the conversations that go on. A second turn moves one to the main table.
MINTED = "mts-"


def session_key(request: Request) -> str | None:
    """The conversation a request belongs to, when it says, within its caller's account.

    Two accounts calling a shared function with the same session id are two conversations: one
    cannot steer the other's turns onto an instance (where a server that shares its prefix cache
    between requests would let cache timing tell one caller about another's prompts).
    """
    for name, value in request.headers:
        if len(name) == len(HEADER) and name.lower() == HEADER:
            value = value.strip()
            return f"{request.nca_id}/{value}" if 0 < len(value) <= MAX_KEY else None
    return None


class Place(NamedTuple):
    """Where a conversation's last turn was served: the instance, and the node its worker is connected to."""

    instance: str
    node: str


class _Entry(NamedTuple):
    place: Place
    at: float
    announced: float


class Affinity:
    """Conversation -> the instance that took its last turn, per function version; bounded and expiring.

    ``node`` names this node among the invocation nodes (unique per process, so two processes
    started with one configured node id are still two).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic, *, node: str | None = None) -> None:
        self._clock = clock
        self.node = node or uuid.uuid4().hex
        self._last: OrderedDict[tuple[str, str], _Entry] = OrderedDict()
        #: First turns of conversations the gateway named (:data:`MINTED`), until a second one.
        self._first: OrderedDict[tuple[str, str], _Entry] = OrderedDict()

    def place_of(self, version_id: str, key: str) -> Place | None:
        for table in (self._last, self._first):
            found = table.get((version_id, key))
            if found is None:
                continue
            if self._clock() - found.at > TTL:
                del table[(version_id, key)]
                return None
            return found.place
        return None

    def took(self, version_id: str, key: str, instance_id: str) -> bool:
        """An instance connected to this node took the conversation's latest turn.

        True when the other nodes should be told: the conversation is new here or moved, or they were
        last told long enough ago.
        """
        now, place = self._clock(), Place(instance_id, self.node)
        before = self._last.get((version_id, key)) or self._first.get((version_id, key))
        if before is not None and before.place == place and now - before.announced < REANNOUNCE:
            self._put(version_id, key, _Entry(place, now, before.announced), again=True)
            return False
        self._put(version_id, key, _Entry(place, now, now), again=before is not None)
        return True

    def heard(self, version_id: str, key: str, place: Place) -> None:
        """Another node says one of its instances took the conversation's latest turn."""
        if place.node != self.node:
            now = self._clock()
            again = (version_id, key) in self._last or (version_id, key) in self._first
            self._put(version_id, key, _Entry(place, now, now), again=again)

    def forget(self, version_id: str, key: str) -> None:
        """The conversation's instance did not answer: its next turn goes wherever it is pulled."""
        self._last.pop((version_id, key), None)
        self._first.pop((version_id, key), None)

    def _put(self, version_id: str, key: str, entry: _Entry, *, again: bool) -> None:
        """Keep the entry: a gateway-named conversation's first turn apart, anything else (or a later
        turn) in the main table.
        """
        at = (version_id, key)
        first = not again and key.partition("/")[2].startswith(MINTED)
        table = self._first if first else self._last
        if not first:
            self._first.pop(at, None)
        table[at] = entry
        table.move_to_end(at)
        while len(table) > MAX_SESSIONS:
            table.popitem(last=False)

    def __len__(self) -> int:
        return len(self._last) + len(self._first)
