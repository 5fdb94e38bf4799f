"""The control plane's state: typed KV buckets, watch-fed mirrors for reads, CAS loops for writes.

Reads come from the mirrors (no I/O); a miss on a single-key read falls back to the bucket, so a
write made through another node a moment ago is never reported missing. Writes go to the bucket
with the revision they were computed from, and retry on conflict, so two control-plane processes
never overwrite each other.
"""

from __future__ import annotations

import logging
from typing import Generic, TypeVar, final

import anyio
import anyio.lowlevel
from anyio.abc import TaskStatus

from nvcf_mono.bus.api import Bus
from nvcf_mono.bus.codec import TypedKV, VersionedCodec
from nvcf_mono.bus.mirror import CATCH_UP, Change, KvMirror, Signal
from nvcf_mono.contracts import buckets
from nvcf_mono.models.account import Account
from nvcf_mono.models.asset import Asset
from nvcf_mono.models.cluster import Cluster, ClusterHeartbeat
from nvcf_mono.models.deployment import Deployment
from nvcf_mono.models.function import FunctionVersion
from nvcf_mono.models.placement import SpecPlacement
from nvcf_mono.models.secret import SealedSecrets, StoredRegistryCredential
from nvcf_mono.models.sharing import AuthorizedParties
from nvcf_mono.models.task import Task
from nvcf_mono.models.telemetry import StoredTelemetry

T = TypeVar("T")


@final
class Table(Generic[T]):
    """One bucket: a mirror for reads and CAS writes."""

    def __init__(self, bus: Bus, bucket: str, codec: VersionedCodec[T], signal: Signal, log: logging.Logger) -> None:
        self.kv = TypedKV(bus.kv(bucket), codec)
        self.mirror = KvMirror(bus.kv(bucket), codec, signal=signal, log=log)

    def get(self, key: str) -> T | None:
        return self.mirror.get(key)

    async def fetch(self, key: str) -> T | None:
        """The mirror's value, or the bucket's when the mirror has not seen the key yet."""
        found = self.mirror.get(key)
        if found is not None:
            return found
        stored = await self.kv.get(key)
        if stored is None:
            return None
        self.mirror.note(key, stored.value, stored.revision)
        return stored.value

    def values(self) -> list[T]:
        return self.mirror.values()

    def items(self) -> list[tuple[str, T]]:
        return list(self.mirror.items())

    async def put(self, key: str, value: T) -> T:
        revision = await self.kv.put(key, value)
        self.mirror.note(key, value, revision)
        return value

    async def create(self, key: str, value: T) -> T:
        """Write a new key; raises ConflictError when it exists."""
        revision = await self.kv.create(key, value)
        self.mirror.note(key, value, revision)
        return value

    async def delete(self, key: str) -> None:
        revision = await self.kv.delete(key)
        self.mirror.note(key, None, revision)

    async def mutate(self, key: str, change: Change[T], *, attempts: int = 50) -> T | None:
        """Apply ``change`` until the write wins (:meth:`KvMirror.mutate`); returns the new value."""
        return await self.mirror.mutate(key, change, attempts=attempts)


@final
class ControlStore:
    """Every bucket the control plane keeps; ``changed`` fires on any change the mirrors see."""

    def __init__(self, bus: Bus, log: logging.Logger, *, signal: Signal | None = None) -> None:
        self.changed = signal or Signal()
        self._tables: list[Table[object]] = []

        def table(bucket: str, codec: VersionedCodec[T]) -> Table[T]:
            t = Table(bus, bucket, codec, self.changed, log)
            self._tables.append(t)  # type: ignore[arg-type]
            return t

        self.accounts: Table[Account] = table(buckets.ACCOUNTS.name, buckets.ACCOUNT)
        self.functions: Table[FunctionVersion] = table(buckets.FUNCTIONS.name, buckets.FUNCTION)
        self.deployments: Table[Deployment] = table(buckets.DEPLOYMENTS.name, buckets.DEPLOYMENT)
        self.placements: Table[SpecPlacement] = table(buckets.PLACEMENTS.name, buckets.PLACEMENT)
        self.autoscaler: Table[buckets.AutoscalerTarget] = table(buckets.AUTOSCALER.name, buckets.AUTOSCALER_TARGET)
        self.clusters: Table[Cluster] = table(buckets.CLUSTERS.name, buckets.CLUSTER)
        self.health: Table[ClusterHeartbeat] = table(buckets.CLUSTER_HEALTH.name, buckets.HEARTBEAT)
        self.authorizations: Table[AuthorizedParties] = table(buckets.AUTHORIZATIONS.name, buckets.AUTHORIZED_PARTIES)
        self.secrets: Table[SealedSecrets] = table(buckets.SECRETS.name, buckets.SEALED_SECRETS)
        self.registry_credentials: Table[StoredRegistryCredential] = table(
            buckets.REGISTRY_CREDENTIALS.name, buckets.REGISTRY_CREDENTIAL
        )
        self.telemetries: Table[StoredTelemetry] = table(buckets.TELEMETRIES.name, buckets.TELEMETRY)
        self.assets: Table[Asset] = table(buckets.ASSETS.name, buckets.ASSET)
        self.tasks: Table[Task] = table(buckets.TASKS.name, buckets.TASK)
        # Events and results are read on demand (a task's own keys), not mirrored.
        self.task_events = TypedKV(bus.kv(buckets.TASK_EVENTS.name), buckets.TASK_EVENT)
        self.task_results = TypedKV(bus.kv(buckets.TASK_RESULTS.name), buckets.TASK_RESULT)

    async def run(self, bus: Bus, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Keep every mirror current; ready once all have loaded."""
        async with anyio.create_task_group() as tg:
            for t in self._tables:
                await tg.start(t.mirror.run, bus)
            task_status.started()

    # ---- lookups used across the API --------------------------------------------------------------

    async def versions_now(self, function_id: str) -> list[FunctionVersion]:
        """:meth:`versions_of`, sure of an empty answer: a function another control node created a moment
        ago is found (this node's copy catches up with every write made until now before it says none).
        """
        versions = self.versions_of(function_id)
        if not versions and await self.functions.mirror.caught_up(CATCH_UP):
            versions = self.versions_of(function_id)
        return versions

    async def deployment_now(self, deployment_id: str) -> Deployment | None:
        """:meth:`deployment_by_id`, sure of a missing answer, as :meth:`versions_now` is."""
        dep = self.deployment_by_id(deployment_id)
        if dep is None and await self.deployments.mirror.caught_up(CATCH_UP):
            dep = self.deployment_by_id(deployment_id)
        return dep

    def versions_of(self, function_id: str) -> list[FunctionVersion]:
        return sorted(self.functions.mirror.group(function_id), key=lambda v: (v.created_at, v.version_id))

    def deployment_by_id(self, deployment_id: str) -> Deployment | None:
        for dep in self.deployments.values():
            if dep.deployment_id == deployment_id:
                return dep
        return None

    def placements_of(self, function_version_id: str) -> list[SpecPlacement]:
        return self.placements.mirror.group(function_version_id)
