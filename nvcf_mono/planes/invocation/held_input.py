"""Client input an invocation node holds in memory, bounded per account.

A node holds a request's bytes while it reads them: an HTTP body up to the inline limit (a larger
one streams on into the object store), an LLM gateway call's JSON, a gRPC call's messages until the
call is stored or, for a live call, until its server has read them (all of them until its answer
starts). Each request is bounded on its own (``max_request_body``); this bounds one account's
requests together on one node, so a tenant's many calls cannot take the memory every account's calls
need. A call that would pass the limit is refused with 429 and ``Retry-After`` (gRPC:
RESOURCE_EXHAUSTED) before the bytes that would pass it are read; nothing of it was stored.

Counts live in this node only (memory is per node): no bus I/O, and an account's entry goes when its
last call ends, so the table grows with the accounts that have calls in flight, not with history.
"""

from __future__ import annotations

from types import TracebackType
from typing import final

from nvcf_mono.http.problem import ProblemError

SETTING = "plugins.invocation.account_held_input_max_bytes"


class TooMuchHeld(ProblemError):
    """The account's requests hold as much of their input on this node as they may."""


@final
class HeldInput:
    """Bytes of client input held on this node per account, within ``limit`` each (0: no limit)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._held: dict[str, int] = {}

    def hold(self, account: str) -> Hold:
        """One request's share of ``account``'s bytes: given back in full when it is closed."""
        return Hold(self, account)

    def held(self, account: str) -> int:
        return self._held.get(account, 0)

    def accounts(self) -> int:
        """How many accounts hold anything now."""
        return len(self._held)

    def _take(self, account: str, size: int) -> None:
        held = self._held.get(account, 0) + size
        if self.limit and held > self.limit:
            raise TooMuchHeld(
                429,
                f"this account's requests already hold {held - size} bytes of their input on this node, and "
                f"{size} more would pass the limit of {self.limit} ({SETTING}); retry when some have finished, "
                "or hand large inputs to the function as assets",
                headers={"Retry-After": "1"},
            )
        self._held[account] = held

    def _give(self, account: str, size: int) -> None:
        left = self._held.get(account, 0) - size
        if left > 0:
            self._held[account] = left
        else:
            self._held.pop(account, None)


@final
class Hold:
    """What one request holds of its account's bytes."""

    __slots__ = ("_account", "_input", "size")

    def __init__(self, held: HeldInput, account: str) -> None:
        self._input = held
        self._account = account
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
        self.give(self.size)

    def __enter__(self) -> Hold:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()
