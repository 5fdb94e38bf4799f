"""Values a plugin makes when it runs, for objects it built in ``setup()``: one holder, one answer.

Routes and servicers are registered in ``setup()``, before the bus, the keyring or the plugin's own
parts exist; they hold a :class:`Late` and read it per call. Until it is set, reading it raises
:class:`NotReady`, which the HTTP server answers with 503 and ``Retry-After`` and the gRPC server with
UNAVAILABLE (the same answer as for a route whose plugin is not running yet). In the spirit of
aiohttp's ``AppKey``: typed, named, set once per run.
"""

from __future__ import annotations

from typing import Generic, TypeVar, final

from nvcf_mono.errors import NvcfMonoError

T = TypeVar("T")


class NotReady(NvcfMonoError):
    """A value was asked for before the plugin that makes it was running."""


@final
class Late(Generic[T]):
    """A value set when its plugin runs."""

    __slots__ = ("_value", "what")

    def __init__(self, what: str) -> None:
        #: What it is, for the 503's detail ("the invocation plane", "API keys").
        self.what = what
        self._value: T | None = None

    def set(self, value: T) -> None:
        self._value = value

    def get(self) -> T:
        if self._value is None:
            raise NotReady(f"{self.what} is starting")
        return self._value

    @property
    def is_set(self) -> bool:
        return self._value is not None
