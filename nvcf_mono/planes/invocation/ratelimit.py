"""Rate limiting of invocations: NVCF's fixed windows per user and per account, shared by every invocation node.

Rules (reference invocation-plane §5). A version's ``rateLimit`` gives up to two tiers, ANDed and checked
in this order, the first refusal deciding: per user (``perUserRate``, when the caller has a subject) and
per account (the caller's ``perNcaIdRate`` entry, else the global ``rateLimit`` unless the account is in
``exemptedNcaIds``). Each rate of a comma list (``3-S,10-M``) is a fixed window of its own, aligned to the
epoch and keyed like NVCF: ``<ncaId>.<fvid>.<N>-<unit>.<window>`` and
``user.<subject>.<ncaId>.<fvid>.<N>-<unit>.<window>`` in the ``nvcf_rate_limits`` bucket (``.`` for NVCF's
``:``, which NATS keys cannot hold). A refused request is counted nowhere; it gets 429 with
``Retry-After`` (seconds until the refusing window ends). Versions without ``rateLimit`` cost nothing.

Sharing. A window's counter in the bucket holds what all nodes together admitted in it and expires
soon after the window. Each node keeps, per window, the total it last read or wrote (``shared``) and
its admissions not yet written (``local``), and knows how many invocation nodes there are (``N``: each
announces itself in the bucket under ``node.<id>`` with a TTL). With ``share(h) = h // (2N)`` (all of
``h`` when ``N`` is 1):

- Hot path, no I/O: admitted while ``local < share(limit - shared)``; refused once
  ``shared + local >= limit``. Far below the limit nothing else happens per request.
- In between, or always with ``syncCheck``, the request waits for a compare-and-set on the counter that
  adds the node's unwritten admissions and grants what the limit leaves, less the shares the other
  nodes may hold unwritten (not with ``syncCheck``); the requests waiting on one node share each write,
  and rounds repeat on the fresh total until they are decided. If that takes longer than
  ``plugins.invocation.rate_limit_timeout`` (or the bus fails) the request is admitted (fail-open,
  ``nvcf_invocation_rate_limit_fail_open_total``) and counted locally, so a node cut off from the bus
  still holds each window to its limit on its own.
- Every ``plugins.invocation.rate_limit_flush`` seconds, and at once when its share is spent, a node
  adds its unwritten admissions to the counter (compare-and-set), which also reads the others' counts.

Approximation. With ``syncCheck`` a window never admits more than its limit: every admission is
granted by a compare-and-set against the total (fail-open aside). Without it the slack is the
admissions other nodes have made and not yet written: a node's unwritten admissions never exceed
``share(limit)``, and a node that has read a total at the limit admits no more, so ``N`` nodes that
know of each other admit at most ``limit + N * share(limit)`` (1.5 x limit) in one window in the worst
case, all of them spending their shares on stale totals just before the limit is reached (10-S on 2
nodes: 14). Measured in random bursts on 2-6 nodes (tests/unit/invocation/test_ratelimit.py) it is a
small part of that: 10-S on 2 nodes admitted at most 12, 100-S on 6 nodes at most 111 with a bus of
0-30 ms; requests spread over the window, and rates well below or above the limit, see none. A node that does not yet
see a newly started one (for the milliseconds its announcement takes) counts one node fewer; a node
that stopped without saying so is counted until its announcement expires (``PRESENCE_TTL``), which
only makes the others' shares smaller.
"""

from __future__ import annotations

import enum
import logging
import math
import time
import uuid
from collections.abc import Callable
from typing import Protocol, final

import anyio
import attrs
from anyio.abc import TaskGroup, TaskStatus

from nvcf_mono.auth.principal import Principal
from nvcf_mono.bus.api import Bus, KeyValue
from nvcf_mono.bus.codec import SchemaVersionError
from nvcf_mono.bus.errors import BusError, ConflictError
from nvcf_mono.bus.mirror import KvMirror
from nvcf_mono.contracts import buckets
from nvcf_mono.http.problem import ProblemError
from nvcf_mono.log import Throttle
from nvcf_mono.metrics import Metrics
from nvcf_mono.models.common import now_iso
from nvcf_mono.models.function import FunctionVersion, RateLimit, parse_rates
from nvcf_mono.planes.invocation.config import InvocationConfig

_UNITS = {1.0: ("S", "second"), 60.0: ("M", "minute"), 3600.0: ("H", "hour"), 86400.0: ("D", "day")}
#: A counter outlives its window by this much, so a clock a little behind still finds it.
_TTL_GRACE = 2.0
#: The longest one compare-and-set round may take (requests waiting on it gave up long before).
_ROUND_DEADLINE = 5.0
#: Node announcements live this long unless renewed (every third of it).
PRESENCE_TTL = 15.0
_LOG_EVERY = 10.0


@attrs.frozen
class Rate:
    """One ``N-<unit>`` entry: ``limit`` requests per ``period`` seconds."""

    limit: int
    period: float
    label: str  # "10-S"
    unit: str  # "second"


@attrs.frozen
class Tier:
    """One tier of a version's rules: its rates and which rule they come from (for the 429 detail)."""

    user: bool
    rates: tuple[Rate, ...]
    rule: str


@attrs.frozen
class Plan:
    """A version's ``rateLimit``, parsed once."""

    user: Tier | None
    account: Tier | None
    per_account: dict[str, Tier]
    exempted: frozenset[str]
    sync: bool

    def tiers(self, principal: Principal) -> list[Tier]:
        """The tiers that apply to this caller, in checking order."""
        out = []
        if self.user is not None and principal.subject:
            out.append(self.user)
        own = self.per_account.get(principal.account)
        if own is not None:
            out.append(own)
        elif self.account is not None and principal.account not in self.exempted:
            out.append(self.account)
        return out


def parse(value: str) -> tuple[Rate, ...]:
    """``"3-S, 10-M"`` -> its rates (the string was validated when the version was written)."""
    out = []
    for count, period in parse_rates(value):
        letter, unit = _UNITS[period]
        out.append(Rate(count, period, f"{count}-{letter}", unit))
    return tuple(out)


def plan_of(rl: RateLimit) -> Plan:
    """The tiers of a ``rateLimit``."""
    user = Tier(True, parse(rl.per_user_rate), "perUserRate") if rl.per_user_rate else None
    account = Tier(False, parse(rl.rate_limit), "rateLimit") if rl.rate_limit else None
    per_account = {nca: Tier(False, parse(v), "perNcaIdRate") for nca, v in (rl.per_nca_id_rate or {}).items() if v}
    return Plan(user, account, per_account, frozenset(rl.exempted_nca_ids or ()), bool(rl.sync_check))


class Decision(enum.Enum):
    """What a window says about one more request without asking the bus."""

    ADMIT = "admit"
    DENY = "deny"
    SYNC = "sync"


class WaiterState(enum.Enum):
    """Where a waiting request stands."""

    PENDING = "pending"
    GRANTED = "granted"
    DENIED = "denied"
    OPEN = "open"  # gave up waiting and was admitted (fail-open); counted in ``local``
    DROPPED = "dropped"  # the request went away while waiting


@final
class Waiter:
    """A request waiting for a compare-and-set round to grant or refuse it."""

    __slots__ = ("done", "state")

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.state = WaiterState.PENDING


@final
class Window:
    """One rate of one tier in one fixed window, as this node sees it."""

    __slots__ = (
        "busy", "contended", "end", "exact", "key", "limit", "local", "rate", "revision", "shared", "tier", "waiters",
    )  # fmt: skip

    def __init__(self, key: str, rate: Rate, tier: Tier, end: float) -> None:
        self.key = key
        self.rate = rate
        self.tier = tier
        self.limit = rate.limit
        self.end = end
        self.shared = 0  # the total in the bucket when this node last read or wrote it
        self.revision = 0  # its revision (0: none seen)
        self.local = 0  # admitted here and not yet added to the total (refunds make it negative)
        self.waiters: list[Waiter] = []
        self.busy = False  # a compare-and-set round is running
        self.contended = False  # another node wrote since our last write: read before writing
        self.exact = False  # syncCheck: grants need no room for the other nodes' unwritten counts

    def allowance(self, nodes: int) -> int:
        """The share of the known headroom this node may spend without asking."""
        return share(self.limit - self.shared, nodes)

    def decide(self, nodes: int, *, sync: bool) -> Decision:
        if self.shared + self.local >= self.limit:
            return Decision.DENY
        if sync or self.local >= self.allowance(nodes):
            return Decision.SYNC
        return Decision.ADMIT

    def grant(self, current: int, delta: int, want: int, nodes: int) -> tuple[int, int]:
        """(requests granted, new total) when ``delta`` pending admissions join ``current``."""
        room = self.limit - current - delta
        if not self.exact and nodes > 1 and room > 0:
            # Leave the others what they may have admitted and not yet written (their shares).
            room -= (nodes - 1) * share(self.limit - current, nodes)
        granted = max(0, min(want, room))
        return granted, max(0, current + delta + granted)


def share(headroom: int, nodes: int) -> int:
    """What one of ``nodes`` may admit on its own out of ``headroom``: all of it alone, else half its part."""
    if nodes <= 1:
        return max(0, headroom)
    return max(0, headroom) // (2 * nodes)


class NodeCount(Protocol):
    """How many invocation nodes share the counters (this one included)."""

    def count(self) -> int: ...

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None: ...


@final
class FixedNodes:
    """A node count that never changes (tests, or a single node)."""

    def __init__(self, nodes: int = 1) -> None:
        self.nodes = nodes

    def count(self) -> int:
        return self.nodes

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()


@final
class Presence:
    """Announces this node in the rate-limit bucket and counts the live invocation nodes."""

    def __init__(self, bus: Bus, node: str, log: logging.Logger) -> None:
        self._bus = bus
        self._kv = bus.kv(buckets.RATE_LIMITS.name)
        self.node = f"{node}-{uuid.uuid4().hex[:8]}"  # two processes with one node id still count twice
        self.key = buckets.rate_node_key(self.node)
        self._log = log
        self.mirror = KvMirror(self._kv, buckets.RATE_LIMITER_NODE, pattern=buckets.RATE_NODES_PATTERN, log=log)

    def count(self) -> int:
        seen = len(self.mirror)
        return seen if self.mirror.get(self.key) is not None else seen + 1

    async def _announce(self) -> None:
        value = buckets.RateLimiterNode(node=self.node, seen_at=now_iso())
        revision = await self._kv.put(self.key, buckets.RATE_LIMITER_NODE.encode(value), ttl=PRESENCE_TTL)
        self.mirror.note(self.key, value, revision)

    async def _renew(self) -> None:
        while True:
            await anyio.sleep(PRESENCE_TTL / 3)
            try:
                with anyio.fail_after(PRESENCE_TTL / 3):
                    await self._announce()
            except (BusError, TimeoutError) as err:
                self._log.warning("rate limiting: could not renew this node's announcement: %s", err)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        try:
            with anyio.fail_after(PRESENCE_TTL / 3):
                await self._announce()
        except (BusError, TimeoutError) as err:
            self._log.warning("rate limiting: could not announce this node (will retry): %s", err)
        try:
            async with anyio.create_task_group() as tg:
                await tg.start(self.mirror.run, self._bus)
                tg.start_soon(self._renew)
                task_status.started()
        finally:
            # Leaving at once gives the other nodes their larger shares without waiting for the TTL.
            with anyio.CancelScope(shield=True), anyio.move_on_after(1.0):
                try:
                    await self._kv.delete(self.key)
                except BusError:
                    pass


@final
class RateLimiter:
    """Decides whether a request may go ahead; raises ProblemError(429) when it may not."""

    def __init__(
        self,
        kv: KeyValue,
        config: InvocationConfig,
        *,
        nodes: NodeCount,
        metrics: Metrics,
        log: logging.Logger,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._kv = kv
        self.config = config
        self.nodes = nodes
        self.log = log
        self._clock = clock
        self._windows: dict[str, Window] = {}
        self._dirty: set[Window] = set()  # windows whose local count changed since the last flush
        self._next_prune = 0.0
        self._plans: dict[str, tuple[RateLimit, Plan]] = {}
        self._tg: TaskGroup | None = None
        self._warnings = Throttle(burst=1, interval=_LOG_EVERY)
        self.limited = metrics.counter(
            "nvcf_invocation_rate_limited_total", "Invocations refused by the rate limiter.", ["function_id"]
        )
        self.fail_open = metrics.counter(
            "nvcf_invocation_rate_limit_fail_open_total",
            "Invocations admitted because the shared rate-limit counter did not answer in time.",
        )

    @classmethod
    def on_bus(
        cls, bus: Bus, config: InvocationConfig, *, node: str, metrics: Metrics, log: logging.Logger
    ) -> RateLimiter:
        """A limiter sharing its counts with the other invocation nodes on ``bus``."""
        kv = bus.kv(buckets.RATE_LIMITS.name)
        return cls(kv, config, nodes=Presence(bus, node, log), metrics=metrics, log=log)

    # ---- the hot path -------------------------------------------------------------------------------

    async def admit(self, principal: Principal, fv: FunctionVersion) -> None:
        """Return when the request may go ahead; raise ProblemError(429) when a window is full."""
        rl = fv.rate_limit
        if rl is None:
            return
        plan = self._plan(fv.version_id, rl)
        charged: list[Window] = []
        try:
            for tier in plan.tiers(principal):
                for rate in tier.rates:
                    window = self._window(principal, fv, tier, rate)
                    window.exact = plan.sync
                    decision = window.decide(self.nodes.count(), sync=plan.sync)
                    if decision is Decision.ADMIT:
                        window.local += 1
                        self._dirty.add(window)
                        charged.append(window)
                        if window.local >= window.allowance(self.nodes.count()):
                            self._kick(window)  # share spent: let the others see it now
                    elif decision is Decision.DENY or not await self._sync(window):
                        raise self._refusal(fv, principal, window)
                    else:
                        charged.append(window)
        except BaseException:
            for window in charged:
                window.local -= 1  # refused (or gone): it counts nowhere
                self._dirty.add(window)
            raise

    def _plan(self, version_id: str, rl: RateLimit) -> Plan:
        cached = self._plans.get(version_id)
        if cached is not None and cached[0] is rl:
            return cached[1]
        try:
            plan = plan_of(rl)
        except (ValueError, KeyError) as err:
            # Rates are validated when written; a stored one that is not must not fail invocations.
            self.log.error(
                "rate limiting: version %s has an unreadable rateLimit (%s); not limiting it", version_id, err
            )
            plan = Plan(None, None, {}, frozenset(), False)
        self._plans[version_id] = (rl, plan)
        return plan

    def _window(self, principal: Principal, fv: FunctionVersion, tier: Tier, rate: Rate) -> Window:
        index = int(self._clock() // rate.period)
        if tier.user:
            base = buckets.rate_user_key(principal.subject, principal.account, fv.version_id, rate.label)
        else:
            base = buckets.rate_account_key(principal.account, fv.version_id, rate.label)
        key = buckets.rate_window_key(base, index)
        window = self._windows.get(key)
        if window is None:
            window = self._windows[key] = Window(key, rate, tier, (index + 1) * rate.period)
        return window

    def _refusal(self, fv: FunctionVersion, principal: Principal, window: Window) -> ProblemError:
        self.limited.inc(function_id=fv.id)
        retry = max(1, math.ceil(window.end - self._clock()))
        rate = window.rate
        if window.tier.user:
            who = "per user"
        elif window.tier.rule == "perNcaIdRate":
            who = f"for account {principal.account!r}"
        else:
            who = "per account"
        return ProblemError(
            429,
            f"rate limit exceeded: function version {fv.version_id} accepts {rate.limit} requests per {rate.unit} "
            f"{who} ({window.tier.rule} {rate.label}); retry in {retry} s",
            headers={"Retry-After": str(retry)},
        )

    async def _sync(self, window: Window) -> bool:
        """Wait for a compare-and-set round to decide; admit if it does not in time."""
        waiter = Waiter()
        window.waiters.append(waiter)
        self._kick(window)
        try:
            with anyio.move_on_after(self.config.rate_limit_timeout):
                await waiter.done.wait()
        except BaseException:
            if waiter.state is WaiterState.PENDING:
                waiter.state = WaiterState.DROPPED
            raise
        if waiter.state is WaiterState.PENDING:
            waiter.state = WaiterState.OPEN
            window.local += 1
            self._dirty.add(window)
            self.fail_open.inc()
            self._warn(f"rate limiting: counter {window.key} did not answer in time; admitting")
            return True
        return waiter.state is not WaiterState.DENIED  # granted, or let through by a failed round

    # ---- sharing ------------------------------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Announce this node, and write pending counts every flush interval, until cancelled."""
        async with anyio.create_task_group() as tg:
            await tg.start(self.nodes.run)
            self._tg = tg
            try:
                task_status.started()
                while True:
                    await anyio.sleep(self.config.rate_limit_flush)
                    self.flush()
            finally:
                self._tg = None

    def flush(self) -> None:
        """Start a round for every window with pending counts; forget windows that ended."""
        now = self._clock()
        dirty, self._dirty = self._dirty, set()
        for window in dirty:
            if window.busy:
                self._dirty.add(window)  # its round is running: look again next time
            elif window.waiters or (window.local and window.end > now):
                self._kick(window)
        if now >= self._next_prune:
            self._next_prune = now + 1.0
            for key, window in list(self._windows.items()):
                if window.end <= now and not window.busy and not window.waiters:
                    del self._windows[key]

    def _kick(self, window: Window) -> None:
        if window.busy or self._tg is None:
            return
        window.busy = True
        self._tg.start_soon(self._round, window)

    async def _round(self, window: Window) -> None:
        """Add this node's pending admissions to the window's total and decide the waiting requests."""
        first = True
        try:
            while True:
                batch = [w for w in window.waiters if w.state is WaiterState.PENDING]
                window.waiters = []
                delta = window.local
                # Loop on only for requests waiting: later counts wait for the next flush.
                if not batch and not (first and delta):
                    return
                first = False
                try:
                    with anyio.fail_after(_ROUND_DEADLINE):
                        granted = await self._commit(window, delta, len(batch))
                except (BusError, TimeoutError) as err:
                    self._warn(f"rate limiting: could not update {window.key}: {err}; admitting")
                    for waiter in batch:
                        self._settle(window, waiter, WaiterState.OPEN)
                    self._dirty.add(window)  # its counts wait for the next flush
                    return
                window.local -= delta
                for waiter in batch[:granted]:
                    self._settle(window, waiter, WaiterState.GRANTED)
                if window.shared >= window.limit or not (granted or delta):
                    for waiter in batch[granted:]:
                        self._settle(window, waiter, WaiterState.DENIED)
                else:
                    window.waiters[:0] = batch[granted:]  # room is left: another round, on a fresh total
        finally:
            window.busy = False

    def _settle(self, window: Window, waiter: Waiter, outcome: WaiterState) -> None:
        if waiter.state is WaiterState.PENDING:
            if outcome is WaiterState.OPEN:
                window.local += 1  # admitted without the total: count it in the next write
                self._dirty.add(window)
                self.fail_open.inc()
            waiter.state = outcome
            waiter.done.set()
        elif outcome is WaiterState.GRANTED:
            # Counted in the total although the request was already let through (and counted
            # locally) or went away: take it out again.
            window.local -= 1
            self._dirty.add(window)

    async def _commit(self, window: Window, delta: int, want: int) -> int:
        """Compare-and-set ``total += delta + granted``; returns how many of ``want`` were granted."""
        current, revision = window.shared, window.revision
        fresh = not window.contended  # our last write is probably still the newest
        while True:
            if not fresh:
                current, revision = await self._read(window.key)
            fresh = False
            granted, total = window.grant(current, delta, want, self.nodes.count())
            if not granted and not delta:
                window.shared, window.revision = current, revision
                return 0  # nothing to write (the total is full): no need to prove it fresh
            value = buckets.RATE_COUNT.encode(buckets.RateCount(count=total))
            ttl = max(1.0, window.end - self._clock() + _TTL_GRACE)
            try:
                if revision:
                    revision = await self._kv.update(window.key, value, revision=revision, ttl=ttl)
                else:
                    revision = await self._kv.create(window.key, value, ttl=ttl)
            except ConflictError:
                window.contended = True
                continue
            window.shared, window.revision = total, revision
            return granted

    async def _read(self, key: str) -> tuple[int, int]:
        entry = await self._kv.get(key)
        if entry is None:
            return 0, 0
        try:
            return buckets.RATE_COUNT.decode(entry.value).count, entry.revision
        except SchemaVersionError as err:
            self._warn(f"rate limiting: {key} holds an unreadable count ({err}); starting it again")
            return 0, entry.revision

    def _warn(self, message: str) -> None:
        self._warnings.log(self.log, logging.WARNING, "%s", message)
