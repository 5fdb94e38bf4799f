"""Client input an invocation node holds in memory, bounded per account.

A node holds a request's bytes while it reads them: an HTTP body up to the inline limit (a larger
one streams on into the object store), an LLM gateway call's JSON, a gRPC call's messages until the
call is stored or, for a live call, until its server has read them (all of them until its answer
starts). Each request is bounded on its own (``max_request_body``); this bounds one account's
requests together on one node, so a tenant's many calls cannot take the memory every account's calls
need. A call that would pass the limit is refused with 429 and ``Retry-After`` (gRPC:
RESOURCE_EXHAUSTED) before it keeps the bytes that would pass it (a gRPC message before they are
read); nothing of it was stored.

The number of an account's calls a node serves at once is bounded the same way
(``account_calls_in_flight_max``): each open call holds a connection, its tasks and its waits
whatever its size, and a tenant keeping many thousands open would take the node's memory and file
descriptors from every other.

Counts live in this node only (memory is per node): no bus I/O, and an account's entry goes when its
last call ends, so the table grows with the accounts that have calls in flight, not with history.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import final

from nvcf_mono.http.problem import ProblemError

SETTING = "plugins.invocation.account_held_input_max_bytes"
CALLS_SETTING = "plugins.invocation.account_calls_in_flight_max"


class TooMuchHeld(ProblemError):
    """The account's calls on this node are as many, or hold as much of their input, as they may."""


@final
class HeldInput:
    """Per account, the calls this node serves and the bytes of client input they hold: within ``calls``
    and ``limit`` (0: no limit).
    """

    def __init__(self, limit: int, calls: int = 0) -> None:
        self.limit = limit
        self.most_calls = calls
        self._held: dict[str, int] = {}
        self._calls: dict[str, int] = {}
        #: All accounts together, for the node's metrics.
        self.total_bytes = 0
        self.total_calls = 0
        #: Told which limit refused a call (``held_input`` or ``calls_in_flight``).
        self.on_refusal: Callable[[str], None] | None = None

    def hold(self, account: str) -> Hold:
        """One call of ``account``'s, and its share of the bytes: given back in full when it is closed.
        :class:`TooMuchHeld` when the account has as many calls in flight here as it may.
        """
        calls = self._calls.get(account, 0)
        if self.most_calls and calls >= self.most_calls:
            self._refused("calls_in_flight")
            raise TooMuchHeld(
                429,
                f"this account has {calls} calls in flight on this node, the most it may ({CALLS_SETTING}); "
                "retry when some have finished",
                headers={"Retry-After": "1"},
            )
        self._calls[account] = calls + 1
        self.total_calls += 1
        return Hold(self, account)

    def held(self, account: str) -> int:
        return self._held.get(account, 0)

    def calls(self, account: str) -> int:
        return self._calls.get(account, 0)

    def accounts(self) -> int:
        """How many accounts have calls in flight or hold anything now."""
        return len(self._calls.keys() | self._held.keys())

    def _take(self, account: str, size: int) -> None:
        held = self._held.get(account, 0) + size
        if self.limit and held > self.limit:
            self._refused("held_input")
            raise TooMuchHeld(
                429,
                f"this account's requests already hold {held - size} bytes of their input on this node, and "
                f"{size} more would pass the limit of {self.limit} ({SETTING}); retry when some have finished, "
                "or hand large inputs to the function as assets",
                headers={"Retry-After": "1"},
            )
        self._held[account] = held
        self.total_bytes += size

    def _give(self, account: str, size: int) -> None:
        _less(self._held, account, size)
        self.total_bytes -= size

    def _end(self, account: str) -> None:
        _less(self._calls, account, 1)
        self.total_calls -= 1

    def _refused(self, limit: str) -> None:
        if self.on_refusal is not None:
            self.on_refusal(limit)


def _less(counts: dict[str, int], account: str, by: int) -> None:
    left = counts.get(account, 0) - by
    if left > 0:
        counts[account] = left
    else:
        counts.pop(account, None)


@final
class Hold:
    """One call in flight, and what it holds of its account's bytes."""

    __slots__ = ("_account", "_input", "_open", "size")

    def __init__(self, held: HeldInput, account: str) -> None:
        self._input = held
        self._account = account
        self._open = True
        self.size = 0

    def take(self, size: int) -> None:
        """Count ``size`` more bytes; :class:`TooMuchHeld` (nothing counted) past the account's limit."""
        if size > 0:
            self._input._take(self._account, size)
            self.size += size

    def give(self, size: int) -> None:
        """``size`` of this request's bytes are let go before it ends."""
        size = min(size, self.size)
        if size > 0:
            self._input._give(self._account, size)
            self.size -= size

    def close(self) -> None:
        """The call is over: its bytes are given back and it no longer counts (once, however often closed)."""
        self.give(self.size)
        if self._open:
            self._open = False
            self._input._end(self._account)

    def __enter__(self) -> Hold:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()
