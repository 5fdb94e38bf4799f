"""The invocation plane's metrics, under NVCF's names (its dots become underscores).

``function_request_latency`` (histogram), ``function_request`` and ``app_invocation_error``
(counters) are recorded around every invocation entry point (pexec, exec, Host routing);
``nvcf_invocation_queue_wait_seconds`` and ``nvcf_invocation_execution_seconds`` split a
response's time to its head into the wait in the queue and the function's own time;
``nvcf_worker_nats_queue_depth_and_inflight`` is a gauge per deployed version, refreshed by one
task every few seconds so a scrape costs no bus call. The same task drops every series of a
version, and of a function, once it is deleted: /metrics holds what exists, not its history.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import final

import anyio
from aiohttp import web
from anyio.abc import TaskStatus

from nvcf_mono.bus.api import Bus
from nvcf_mono.bus.errors import BusError
from nvcf_mono.contracts import streams
from nvcf_mono.http.problem import ProblemError
from nvcf_mono.metrics import LATENCY_BUCKETS, Metrics
from nvcf_mono.models.function import CONNECTABLE, FunctionVersion
from nvcf_mono.planes.invocation.dispatch import Dispatcher
from nvcf_mono.planes.invocation.held_input import HeldInput
from nvcf_mono.planes.invocation.routing import RoutingTable

#: NVCF's buckets end at 1800 s; ours start at sub-millisecond, where the platform's own overhead shows.
REQUEST_LATENCY_BUCKETS = (*LATENCY_BUCKETS, 600, 1800)
#: The label of errors answered before the function was known (no caller-chosen ids as label values).
UNKNOWN = "unknown"
QUEUE_REFRESH = 5.0
QUEUE_CALL_TIMEOUT = 2.0
CLIENT_GONE = 499


@final
class Observation:
    """What one invocation turned out to be, filled in as the handler learns it."""

    __slots__ = ("function_id", "nca_id", "version_id")

    def __init__(self) -> None:
        self.function_id = ""
        self.version_id = ""
        self.nca_id = ""

    def target(self, fv: FunctionVersion, nca_id: str) -> None:
        """The version being invoked and the caller's account."""
        self.function_id = fv.id
        self.version_id = fv.version_id
        self.nca_id = nca_id


Entry = Callable[[Observation], Awaitable[web.StreamResponse]]


@final
class InvocationMetrics:
    """Declared in the plugin's setup(); observe() wraps each invocation."""

    def __init__(self, registry: Metrics) -> None:
        self._registry = registry
        #: Told of every answered invocation of a known version (the load reports' traffic counts).
        self.on_answer: Callable[[str, str, int, float], None] | None = None
        #: (function id, version id) of every version with series, until it is deleted.
        self._recorded: set[tuple[str, str]] = set()
        self.latency = registry.histogram(
            "function_request_latency",
            "Time to serve an invocation (to the end of its response, or its 202), by function version.",
            ["function_id", "function_version_id"],
            buckets=REQUEST_LATENCY_BUCKETS,
        )
        self.requests = registry.counter(
            "function_request",
            "Invocations of a function version, by the caller's account.",
            ["function_id", "function_version_id", "nca_id"],
        )
        self.errors = registry.counter(
            "app_invocation_error",
            "Invocations answered with an error status (499: the client went away first).",
            ["http_status_code", "function_id"],
        )
        self.queue_wait = registry.histogram(
            "nvcf_invocation_queue_wait_seconds",
            "Time a request waited in its queue (stored to taken by an instance, a cold start included).",
            ["function_id", "function_version_id"],
            buckets=REQUEST_LATENCY_BUCKETS,
        )
        self.execution = registry.histogram(
            "nvcf_invocation_execution_seconds",
            "The function's time to the head of its response, as its instance's worker measured it.",
            ["function_id", "function_version_id"],
            buckets=REQUEST_LATENCY_BUCKETS,
        )
        # Node totals: the accounts are not labels (refusals are counted per limit), so the series stay few.
        self.calls_in_flight = registry.gauge(
            "nvcf_invocation_calls_in_flight", "Calls this node serves now (status polls included), all accounts."
        )
        self.held_input = registry.gauge(
            "nvcf_invocation_held_input_bytes", "Bytes of request input this node holds now, all accounts."
        )
        self.limit_refusals = registry.counter(
            "nvcf_invocation_account_limit_refusals_total",
            "Calls refused because their account reached one of its limits on this node (held_input: "
            "account_held_input_max_bytes, calls_in_flight: account_calls_in_flight_max).",
            ["limit"],
        )
        self.queue_depth = registry.gauge(
            "nvcf_worker_nats_queue_depth_and_inflight",
            "Requests queued or in flight per function version (refreshed every few seconds).",
            ["function_id", "function_version_id"],
        )

    def watch(self, held: HeldInput) -> None:
        """Report ``held``: the node's calls in flight, the client input they hold, and what its account
        limits refused.
        """
        self.calls_in_flight.set_function(lambda: [((), float(held.total_calls))])
        self.held_input.set_function(lambda: [((), float(held.total_bytes))])
        held.on_refusal = lambda limit: self.limit_refusals.inc(limit=limit)

    async def observe(self, entry: Entry) -> web.StreamResponse:
        """Run one invocation and record its latency, count and error status."""
        obs = Observation()
        started = time.perf_counter()
        status = 500
        try:
            response = await entry(obs)
            status = response.status
            return response
        except ProblemError as err:
            status = err.status
            raise
        except web.HTTPException as err:
            status = err.status
            raise
        except (asyncio.CancelledError, ConnectionError):
            status = CLIENT_GONE  # a hang-up cancels the handler
            raise
        finally:
            self._record(obs, status, time.perf_counter() - started)

    def phases(self, function_id: str, version_id: str, queue_wait: float, execution: float) -> None:
        """A response's head came: how long its request waited in the queue and ran (seconds)."""
        self.queue_wait.observe(queue_wait, function_id=function_id, function_version_id=version_id)
        self.execution.observe(execution, function_id=function_id, function_version_id=version_id)

    def _record(self, obs: Observation, status: int, seconds: float) -> None:
        if obs.function_id:
            if self.on_answer is not None:
                self.on_answer(obs.function_id, obs.version_id, status, seconds)
            self._recorded.add((obs.function_id, obs.version_id))
            self.requests.inc(function_id=obs.function_id, function_version_id=obs.version_id, nca_id=obs.nca_id)
            self.latency.observe(seconds, function_id=obs.function_id, function_version_id=obs.version_id)
        if status >= 400:
            self.errors.inc(http_status_code=str(status), function_id=obs.function_id or UNKNOWN)

    async def refresh_queue_depth(
        self,
        bus: Bus,
        routing: RoutingTable,
        dispatcher: Dispatcher,
        log: logging.Logger,
        *,
        interval: float = QUEUE_REFRESH,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Keep the queue-depth gauge current and drop the series of deleted versions and functions.

        Every version's depth comes from one listing per interval.
        """
        task_status.started()
        shown: set[tuple[str, str]] = set()
        while True:
            depths: dict[str, int] | None = None
            with anyio.move_on_after(QUEUE_CALL_TIMEOUT):
                try:
                    depths = await streams.queue_depths(bus, dispatcher.region)
                except BusError as err:
                    log.debug("queue depths: %s", err)
            if depths is not None:  # unknown this round: the last values stay
                live: set[tuple[str, str]] = set()
                for fv in routing.functions.values():
                    if fv.status in CONNECTABLE:
                        live.add((fv.id, fv.version_id))
                        self.queue_depth.set(
                            depths.get(fv.version_id, 0), function_id=fv.id, function_version_id=fv.version_id
                        )
                for function_id, version_id in shown - live:
                    self.queue_depth.forget(function_id=function_id, function_version_id=version_id)
                shown = live
            self._forget_deleted(routing)
            await anyio.sleep(interval)

    def _forget_deleted(self, routing: RoutingTable) -> None:
        gone = {(f, v) for f, v in self._recorded if routing.version(f, v) is None}
        if not gone:
            return
        self._recorded -= gone
        functions_left = {fv.id for fv in routing.functions.values()}
        for function_id, version_id in gone:
            self._registry.forget(function_version_id=version_id)
            if function_id not in functions_left:
                self._registry.forget(function_id=function_id)
