"""What an account's uploads under way on this node bring, for a quota counted from finished uploads.

A quota such as ``max_account_asset_bytes`` sums the sizes recorded when uploads finish, so uploads
made at once would each see only the finished ones and together pass it. Each upload here is a
:class:`Flow`; ``others()`` is what the account's other uploads brought that no record holds yet:
those under way when it began, and everything brought since (by uploads finished meanwhile too).
State is kept per account only while one of its uploads is under way. Another node's uploads are
seen once they are recorded.
"""

from __future__ import annotations

from collections.abc import Iterator
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

    def bring(self, size: int) -> None:
        """``size`` more bytes of this upload (set aside ahead when its size is announced)."""
        self.mine += size
        self._account.brought += size
        self._account.open += size

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
