"""What an account's uploads under way on this node bring, for a quota counted from finished uploads.

A quota such as ``max_account_asset_bytes`` sums the sizes recorded when uploads finish, so uploads
made at once would each see only the finished ones and together pass it. Each upload here is a
:class:`Flow`; ``others()`` is what the account's other uploads brought that no record holds yet:
those under way when it began, and everything brought since (by uploads finished meanwhile too).
State is kept per account only while one of its uploads is under way. Another node's uploads are
seen once they are recorded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import final

import attrs


@attrs.define
class _Account:
    #: Bytes brought since the first of the uploads under way began (by finished ones too).
    brought: int = 0
    #: Bytes brought by the uploads still under way.
    open: int = 0
    flows: int = 0


@final
@attrs.define
class Flow:
    """One upload of an account."""

    _account: _Account
    _base: int
    mine: int = 0

    def reach(self, total: int, room: int | None, refuse: Callable[[int], BaseException]) -> None:
        """The upload has brought, or announced, ``total`` bytes: what passes what it counts already is
        counted, unless with the others' it would pass ``room`` (None: no limit); then ``refuse(others)``
        is raised. Announced first, its size is set aside whole: of uploads made at once, the first fit.
        """
        more = total - self.mine
        if more <= 0:
            return
        others = self.others()
        if room is not None and total + others > room:
            raise refuse(others)
        self.mine = total
        self._account.brought += more
        self._account.open += more

    def others(self) -> int:
        """Bytes the account's other uploads brought that a finished record may not hold yet."""
        return self._account.brought - self._base - self.mine


@final
class AccountUploads:
    """The uploads under way on this node, per account."""

    def __init__(self) -> None:
        self._accounts: dict[str, _Account] = {}

    @contextmanager
    def flow(self, account: str) -> Iterator[Flow]:
        """An upload of ``account`` for the ``with`` block's length."""
        entry = self._accounts.get(account)
        if entry is None:
            entry = self._accounts[account] = _Account()
        entry.flows += 1
        flow = Flow(entry, entry.brought - entry.open)  # what uploads still under way brought counts too
        try:
            yield flow
        finally:
            entry.open -= flow.mine
            entry.flows -= 1
            if entry.flows == 0:
                del self._accounts[account]

    def __len__(self) -> int:
        return len(self._accounts)
