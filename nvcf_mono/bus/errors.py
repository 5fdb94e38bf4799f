"""Errors of the bus; the NATS adapter translates nats-py's errors into these."""

from __future__ import annotations

from nvcf_mono.errors import NvcfMonoError


class BusError(NvcfMonoError):
    """Something on the bus failed."""


class BusUnavailable(BusError):
    """Not connected (closed, or the server could not be reached in time)."""


class RequestTimeout(BusError):
    """A request got no reply before its deadline."""


class NoResponders(BusError):
    """Nobody subscribes to the subject of a request."""


class RemoteError(BusError):
    """The responder answered with an error instead of a result."""


class NotFound(BusError):
    """A stream, consumer, bucket, key or object does not exist."""


class InvalidKey(BusError, ValueError):
    """A KV key or pattern NATS cannot store (an id with characters no stored id has)."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


class ConflictError(BusError):
    """A KV write lost a race: the key exists (create) or moved past the expected revision (update)."""


class StreamFull(BusError):
    """A stream with discard-new limits refused a message."""


class StoreFull(BusError):
    """JetStream's storage is used up (the server's ``max_file_store`` or ``max_memory_store``)."""


class SpecConflict(BusError):
    """An existing stream or consumer has a configuration the declared spec cannot be applied to."""


class ObjectCorrupted(BusError):
    """An object's chunks do not match its recorded size or digest."""
