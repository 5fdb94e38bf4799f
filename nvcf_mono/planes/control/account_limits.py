"""Limits on how many records of a kind an account keeps, counted and made in one step on a node."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from nvcf_mono.http.problem import ProblemError
from nvcf_mono.planes.control.context import Control


@asynccontextmanager
async def one_more(ctl: Control, *, count: Callable[[], int], most: int | None, refusal: str) -> AsyncIterator[None]:
    """Hold from counting the account's records of a kind to making one more (the ``with`` block).

    400 with ``refusal`` when ``count()`` is already ``most`` (None: no limit). Requests made at once are
    counted one after another, so a burst cannot pass the limit together; another control node's are
    seen once they are stored.
    """
    async with ctl.counted_creation:
        if most is not None and count() >= most:
            raise ProblemError(400, refusal)
        yield
