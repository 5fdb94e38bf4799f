"""A local copy of a KV bucket, kept current by a watch: the read side of caches and reconcilers.

The watch is restarted after the bus reconnects (nats-py's watch can go quiet for a while after a
server restart) and as soon as JetStream says the bucket's stream was deleted or made again (a
watch on a deleted stream would only notice after missing heartbeats); the snapshot then replaces
the copy, so nothing missed stays missed. Values
that cannot be decoded are logged and skipped, never fatal.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar, cast, final

import anyio
import anyio.lowlevel
from anyio.abc import TaskStatus

from nvcf_mono.backoff import Backoff
from nvcf_mono.bus.api import Bus, Entry, KeyValue
from nvcf_mono.bus.codec import SchemaVersionError, Versioned, VersionedCodec
from nvcf_mono.bus.errors import BusError, ConflictError

T = TypeVar("T")

Change = Callable[[T | None], T | None]


#: Seconds a refusal ("no such thing") may wait for a node's copies to catch up with their buckets, so
#: that what another node wrote a moment ago is found rather than refused.
CATCH_UP = 2.0


class Unchanged(Exception):
    """Raised by a change function (:meth:`KvMirror.mutate`) to leave the value as it is."""


#: JetStream's stream advisories: ``<prefix>.CREATED.<stream>``, ``<prefix>.DELETED.<stream>``, ...
ADVISORY_PREFIX = "$JS.EVENT.ADVISORY.STREAM"


@final
class Signal:
    """A change counter tasks can wait on (``version = await signal.wait(after=version)``)."""

    def __init__(self) -> None:
        self.version = 0
        self._event = anyio.Event()

    def notify(self) -> None:
        self.version += 1
        self._event.set()
        self._event = anyio.Event()

    async def wait(self, *, after: int) -> int:
        """Return the current version once it is past ``after``."""
        while self.version <= after:
            await self._event.wait()
        return self.version


@final
class KvMirror(Generic[T]):
    """Every live key matching ``pattern`` in a bucket, decoded, with its revision."""

    def __init__(
        self,
        kv: KeyValue,
        codec: VersionedCodec[T],
        *,
        pattern: str = ">",
        signal: Signal | None = None,
        log: logging.Logger | None = None,
    ) -> None:
        self.kv = kv
        self.codec = codec
        self.pattern = pattern
        self.signal = signal or Signal()
        self._log = log or logging.getLogger(f"nvcf_mono.bus.mirror.{kv.bucket}")
        self._data: dict[str, Versioned[T]] = {}
        self.loaded = anyio.Event()
        #: The newest revision of the bucket this copy has seen (deletes included).
        self.revision = 0
        #: Counts changes of the copy: an index built from it is current while this is unchanged.
        self.generation = 0
        self._groups: dict[str, list[T]] = {}
        self._groups_at = -1  # the generation the groups were built at
        self._watching: anyio.CancelScope | None = None  # the running watch, cancelled to restart it
        self._nudge: anyio.Event | None = None  # set when the bucket's stream is made again

    # ---- reading ----------------------------------------------------------------------------------

    def get(self, key: str) -> T | None:
        found = self._data.get(key)
        return None if found is None else found.value

    def entry(self, key: str) -> Versioned[T] | None:
        return self._data.get(key)

    def items(self) -> Iterator[tuple[str, T]]:
        for key, found in list(self._data.items()):
            yield key, found.value

    def values(self) -> list[T]:
        return [found.value for found in self._data.values()]

    def group(self, token: str) -> list[T]:
        """The values under ``<token>.`` (keys whose first token is ``token``), in key order of arrival.

        From an index built once per change of the copy, so a look-up costs what it returns, not what
        the bucket holds (a version's placements, a function's versions).
        """
        if self._groups_at != self.generation:
            groups: dict[str, list[T]] = {}
            for key, found in self._data.items():
                first, dot, _ = key.partition(".")
                if dot:
                    groups.setdefault(first, []).append(found.value)
            self._groups, self._groups_at = groups, self.generation
        return list(self._groups.get(token, ()))

    def __len__(self) -> int:
        return len(self._data)

    # ---- writing through --------------------------------------------------------------------------

    async def mutate(self, key: str, change: Change[T], *, attempts: int = 50) -> T | None:
        """Apply ``change`` to the bucket's current value until the write wins; returns the new value.

        ``change`` gets None for a missing key and returns None to delete; it may raise
        :class:`Unchanged` to write nothing (the current value is returned) or any error to abort.
        The write is noted at once (:meth:`note`).
        """
        for _ in range(attempts):
            entry = await self.kv.get(key)
            current = None if entry is None else self.codec.decode(entry.value)
            try:
                updated = change(current)
            except Unchanged:
                return current
            try:
                if updated is None:
                    if entry is not None:
                        revision = await self.kv.delete(key, revision=entry.revision)
                        self.note(key, None, revision)
                    return None
                raw = self.codec.encode(updated)
                if entry is None:
                    revision = await self.kv.create(key, raw)
                else:
                    revision = await self.kv.update(key, raw, revision=entry.revision)
            except ConflictError:
                await anyio.lowlevel.checkpoint()
                continue
            self.note(key, updated, revision)
            return updated
        raise ConflictError(f"{self.kv.bucket}/{key}: too many concurrent writers, gave up after {attempts} tries")

    def note(self, key: str, value: T | None, revision: int) -> None:
        """Record this node's own write at once (the watch confirms it later)."""
        current = self._data.get(key)
        if current is not None and current.revision >= revision:
            return
        if value is None:
            if self._data.pop(key, None) is not None:
                self._changed()
            return
        self._data[key] = Versioned(key, value, revision)
        self._changed()

    def _changed(self) -> None:
        self.generation += 1
        self.signal.notify()

    # ---- running ----------------------------------------------------------------------------------

    async def run(self, bus: Bus, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Keep the copy current until cancelled; ready once the first snapshot is loaded."""
        backoff = Backoff(0.1, 5.0)
        async with anyio.create_task_group() as outer:
            await outer.start(self._follow_stream_events, bus)
            while True:
                err = await self._watch_once(bus, task_status)
                if err is None:
                    backoff.reset()  # restarted on purpose (a reconnect, the bucket made again): at once
                    continue
                pause = backoff.next()
                self._log.warning("watch of %s/%s failed (%s); restarting", self.kv.bucket, self.pattern, err)
                with anyio.move_on_after(pause):
                    if self._nudge is not None:
                        await self._nudge.wait()  # the bucket was made again: no need to wait out the pause

    async def _watch_once(self, bus: Bus, task_status: TaskStatus[None]) -> BusError | None:
        """Load the snapshot and follow changes until a restart is due; the bus error that ended it, if any."""
        self._nudge = anyio.Event()
        try:
            async with anyio.create_task_group() as tg:
                self._watching = tg.cancel_scope
                tg.start_soon(self._restart_on_reconnect, bus, tg.cancel_scope)
                async with self.kv.watch(self.pattern) as watch:
                    self._replace(watch.initial)
                    # The watch's revision is the truth: a bucket made again starts counting afresh.
                    self.revision = watch.revision
                    if not self.loaded.is_set():
                        self.loaded.set()
                        task_status.started()
                    async for entry in watch:
                        self._apply(entry)
        except BaseExceptionGroup as group:
            # The task group wraps the watch's error: a bus failure restarts the watch, anything
            # else is a bug and propagates.
            if not all(isinstance(e, BusError) for e in _leaves(group)):
                raise
            return cast(BusError, _leaves(group)[0])
        except BusError as single:
            return single
        return None

    async def _follow_stream_events(self, bus: Bus, *, task_status: TaskStatus[None]) -> None:
        """Restart the watch as soon as the bucket's stream is deleted or made again.

        A watch on a deleted stream does not fail at once (its consumer only misses heartbeats for a
        while), so JetStream's advisories say it instead. Without them (no permission on the
        advisory subjects) the watch still recovers, only later.
        """
        subject = f"{ADVISORY_PREFIX}.*.KV_{self.kv.bucket}"
        task_status.started()
        try:
            async with bus.subscribe(subject, max_pending=64) as sub:
                async for msg in sub:
                    kind = msg.subject[len(ADVISORY_PREFIX) + 1 :].split(".", 1)[0]
                    if kind in ("DELETED", "CREATED"):
                        self._log.info("bucket %s was %s: reloading", self.kv.bucket, kind.lower())
                        if self._nudge is not None:
                            self._nudge.set()
                        if self._watching is not None:
                            self._watching.cancel()
        except BusError as err:
            # Without them a deleted bucket is still noticed, only later (by the watch's heartbeats).
            self._log.warning("no stream advisories for bucket %s: %s", self.kv.bucket, err)

    async def _restart_on_reconnect(self, bus: Bus, scope: anyio.CancelScope) -> None:
        async with bus.events() as events:
            async for event in events:
                if event.kind == "reconnected":
                    self._log.debug("bus reconnected: reloading %s", self.kv.bucket)
                    scope.cancel()
                    return

    def _decode(self, entry: Entry) -> T | None:
        try:
            return self.codec.decode(entry.value)
        except SchemaVersionError as err:
            self._log.error("skipping %s/%s: %s", self.kv.bucket, entry.key, err)
            return None

    def _replace(self, initial: tuple[Entry, ...]) -> None:
        data: dict[str, Versioned[T]] = {}
        for entry in initial:
            value = self._decode(entry)
            if value is not None:
                data[entry.key] = Versioned(entry.key, value, entry.revision)
        self._data = data
        self._changed()

    async def caught_up(self, timeout: float) -> bool:
        """Wait (up to ``timeout``) until the copy holds every write made to the bucket before this call."""
        with anyio.move_on_after(timeout):
            wanted = await self.kv.last_revision()
            while self.revision < wanted:  # noqa: ASYNC110 - not every revision changes the copy (no signal)
                await anyio.sleep(0.01)
            return True
        return False

    def _apply(self, entry: Entry) -> None:
        self.revision = max(self.revision, entry.revision)
        current = self._data.get(entry.key)
        if current is not None and current.revision >= entry.revision:
            return
        if entry.deleted:
            if self._data.pop(entry.key, None) is not None:
                self._changed()
            return
        value = self._decode(entry)
        if value is not None:
            self._data[entry.key] = Versioned(entry.key, value, entry.revision)
            self._changed()


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    out: list[BaseException] = []
    for exc in group.exceptions:
        out.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return out
