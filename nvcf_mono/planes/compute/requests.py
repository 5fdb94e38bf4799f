"""Instance requests on the agent: NVCA's ICMSRequest state machine (reference compute-plane §2), kept
in the bucket ``nvcf_agent_requests`` with compare-and-set, so a restarted agent neither loses nor
duplicates an instance.

``RequestReceived`` (recorded) -> ``RequestPending`` (the control plane has it) -> ``RequestInProgress``
(processes being started) -> ``RequestInstancesInProgress`` (not all running) -> ``RequestCompleted`` or
``RequestFailed`` -> ``...Acknowledged`` once every instance's status is reported. A request whose
instances are all gone and reported is finished: it stays as a tombstone for ``finished_ttl``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

import anyio

from nvcf_mono.bus.api import Bus
from nvcf_mono.bus.codec import TypedKV
from nvcf_mono.bus.errors import ConflictError
from nvcf_mono.contracts import buckets, states
from nvcf_mono.contracts.agent import AgentInstance, AgentRequest, RequestStatus
from nvcf_mono.contracts.messages import CreationMessage
from nvcf_mono.models.common import now_iso
from nvcf_mono.structure import evolve

NOT_LAUNCHED = frozenset({RequestStatus.RECEIVED, RequestStatus.PENDING})


def instance_ids(request_id: str, count: int) -> list[str]:
    """NVCA's pod names ``<i>-sr-<request>`` (63 characters at most)."""
    return [f"{i}-sr-{request_id}"[:63] for i in range(max(count, 1))]


def new_request(msg: CreationMessage, cluster_id: str, now: str) -> AgentRequest:
    """A request as first recorded, before the control plane confirms it."""
    return AgentRequest(
        request_id=msg.request_id,
        cluster_id=cluster_id,
        status=RequestStatus.RECEIVED,
        created_at=now,
        updated_at=now,
        message=msg,
        instances=tuple(
            AgentInstance(instance_id=iid, created_at=now, updated_at=now)
            for iid in instance_ids(msg.request_id, msg.instance_count)
        ),
    )


def next_status(req: AgentRequest) -> RequestStatus:
    """The status the instances imply (NVCA's aggregation); unlaunched requests keep theirs."""
    if req.status in NOT_LAUNCHED and all(i.launched_at is None and not i.gone for i in req.instances):
        return req.status
    insts = req.instances
    if any(i.state in states.BAD_STATES for i in insts):
        base = RequestStatus.FAILED
    elif any(i.launched_at is None and not i.gone for i in insts):
        base = RequestStatus.IN_PROGRESS
    elif any(not i.gone and i.state != states.RUNNING for i in insts):
        base = RequestStatus.INSTANCES_IN_PROGRESS
    else:
        base = RequestStatus.COMPLETED
    reported = all(i.reported == i.signature for i in insts)
    if reported and base is RequestStatus.COMPLETED:
        return RequestStatus.COMPLETION_ACKNOWLEDGED
    if reported and base is RequestStatus.FAILED:
        return RequestStatus.FAILURE_ACKNOWLEDGED
    return base


def replace_instance(req: AgentRequest, inst: AgentInstance) -> AgentRequest:
    return evolve(req, instances=tuple(inst if i.instance_id == inst.instance_id else i for i in req.instances))


def refused(req: AgentRequest, reason: str, now: str) -> AgentRequest:
    """The control plane does not want the request: nothing runs, nothing is left to report."""
    gone = tuple(
        evolve(
            i,
            state=states.TERMINATED,
            status=states.TERMINATED_BY_SERVICE,
            reported=f"{states.TERMINATED_BY_SERVICE}|{states.TERMINATED}",
            reported_at=now,
            updated_at=now,
        )
        for i in req.instances
    )
    return evolve(req, status=RequestStatus.FAILURE_ACKNOWLEDGED, instances=gone, error=reason, updated_at=now)


class RequestBook:
    """The agent's requests: an in-memory copy of its KV records, written with CAS."""

    def __init__(self, bus: Bus, cluster_id: str, *, finished_ttl: float, log: logging.Logger) -> None:
        self._kv = TypedKV(bus.kv(buckets.AGENT_REQUESTS.name), buckets.AGENT_REQUEST)
        self._cluster_id = cluster_id
        self._ttl = finished_ttl
        self._log = log
        self._live: dict[str, tuple[AgentRequest, int]] = {}
        self._locks: dict[str, anyio.Lock] = {}

    def _key(self, request_id: str) -> str:
        return buckets.agent_request_key(self._cluster_id, request_id)

    async def load(self) -> list[AgentRequest]:
        """Every unfinished request of this cluster (at start)."""
        keys = await self._kv.kv.keys(buckets.agent_requests_pattern(self._cluster_id))
        for key in keys:
            found = await self._kv.get(key)
            if found is not None and found.value.finished_at is None:
                self._live[found.value.request_id] = (found.value, found.revision)
        return [r for r, _ in self._live.values()]

    def get(self, request_id: str) -> AgentRequest | None:
        held = self._live.get(request_id)
        return held[0] if held is not None else None

    def __iter__(self) -> Iterator[AgentRequest]:
        return iter([r for r, _ in self._live.values()])

    def __len__(self) -> int:
        return len(self._live)

    async def known(self, request_id: str) -> AgentRequest | None:
        """The request, finished ones (tombstones) included."""
        held = self.get(request_id)
        if held is not None:
            return held
        found = await self._kv.get(self._key(request_id))
        return found.value if found is not None else None

    async def remembered(self) -> list[AgentRequest]:
        """Finished requests still in the bucket (for ``instances --finished``)."""
        out = []
        for key in await self._kv.kv.keys(buckets.agent_requests_pattern(self._cluster_id)):
            found = await self._kv.get(key)
            if found is not None and found.value.finished_at is not None:
                out.append(found.value)
        return out

    async def create(self, req: AgentRequest) -> bool:
        """Record a new request; False when one with its id exists (a redelivery)."""
        try:
            revision = await self._kv.create(self._key(req.request_id), req)
        except ConflictError:
            return False
        self._live[req.request_id] = (req, revision)
        return True

    async def update(self, request_id: str, change: Callable[[AgentRequest], AgentRequest]) -> AgentRequest | None:
        """Apply ``change`` and store it (CAS); the status follows the instances. None if unknown."""
        lock = self._locks.setdefault(request_id, anyio.Lock())
        async with lock:
            held = self._live.get(request_id)
            if held is None:
                return None
            current, revision = held
            for _ in range(5):
                updated = change(current)
                updated = evolve(updated, status=next_status(updated))
                if updated == current:
                    return current
                finished = updated.finished
                if finished:
                    updated = evolve(updated, finished_at=now_iso())
                try:
                    new_revision = await self._kv.update(
                        self._key(request_id), updated, revision=revision, ttl=self._ttl if finished else None
                    )
                except ConflictError:
                    # Only this agent writes its records; another writer means a second agent with this id.
                    self._log.error("request %s was changed by someone else; reading it again", request_id)
                    found = await self._kv.get(self._key(request_id))
                    if found is None:
                        self._live.pop(request_id, None)
                        return None
                    current, revision = found.value, found.revision
                    continue
                if finished:
                    self._live.pop(request_id, None)
                    self._locks.pop(request_id, None)
                else:
                    self._live[request_id] = (updated, new_revision)
                return updated
            raise ConflictError(f"request {request_id}: too many concurrent writers")

    async def finish(self, req: AgentRequest) -> None:
        """Store a request that ends before it ever ran (refused), as a tombstone."""
        lock = self._locks.setdefault(req.request_id, anyio.Lock())
        async with lock:
            held = self._live.pop(req.request_id, None)
            done = evolve(req, finished_at=now_iso())
            if held is None:
                await self._kv.put(self._key(req.request_id), done, ttl=self._ttl)
            else:
                try:
                    await self._kv.update(self._key(req.request_id), done, revision=held[1], ttl=self._ttl)
                except ConflictError:
                    await self._kv.put(self._key(req.request_id), done, ttl=self._ttl)
            self._locks.pop(req.request_id, None)
