"""grpclib wakes a task blocked on a stream that broke (or passed its deadline) with ``Task.cancel()``, then
turns the ``CancelledError`` into its own error (``StreamTerminatedError``, a deadline's) without
``Task.uncancel()``.

From Python 3.11 a task counts the cancellations requested of it, and structured concurrency reads a
count left above zero as a cancellation from outside: a task that once lost a stream stays "being
cancelled" for the rest of its life, and an anyio scope it entered before the loss and cancelled
after it lets the ``CancelledError`` through instead of ending there. A worker that lost its node
once (a platform restart) ended its next drain with that error and a traceback. This gives back
each cancellation grpclib's wrapper turned into its error, as code that swallows a cancellation must.
"""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Any

from grpclib import utils

_cancel = utils.Wrapper.cancel
_exit = utils.Wrapper.__exit__
#: The tasks a wrapper cancelled that have not yet left it.
_CANCELLED = "_nvcf_cancelled"


def _cancel_and_remember(self: utils.Wrapper, error: Exception) -> None:
    setattr(self, _CANCELLED, set(getattr(self, "_tasks", ())))
    _cancel(self, error)


def _exit_uncancelled(
    self: utils.Wrapper,
    exc_type: type[BaseException] | None,
    exc_val: BaseException | None,
    exc_tb: TracebackType | None,
) -> Any:
    task = asyncio.current_task()
    cancelled: set[asyncio.Task[Any]] | None = getattr(self, _CANCELLED, None)
    if cancelled and task in cancelled and exc_type is asyncio.CancelledError:
        cancelled.discard(task)
        task.uncancel()  # the wrapper raises its own error in place of this cancellation
    return _exit(self, exc_type, exc_val, exc_tb)


def install() -> None:
    """Patch grpclib's wrapper (idempotent; ``DeadlineWrapper`` inherits it)."""
    utils.Wrapper.cancel = _cancel_and_remember  # type: ignore[method-assign]
    utils.Wrapper.__exit__ = _exit_uncancelled  # type: ignore[method-assign]
