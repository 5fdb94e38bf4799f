"""What cluster agents call (NVCA -> ICMS in NVCF): registration, heartbeats, request acks, instance
status, and the instance list for periodic reconciliation. Served on ``nvcf.icms.>`` by every
control-plane process in one queue group; every write is a CAS, so any of them may answer.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from typing import Any, final

from anyio.abc import TaskStatus

from nvcf_mono.auth.tokens import WORKER, InvalidToken
from nvcf_mono.bus.mirror import Unchanged
from nvcf_mono.contracts import buckets, rpc, states, subjects
from nvcf_mono.contracts.messages import (
    AckRequest,
    ClusterRegistration,
    Empty,
    Heartbeat,
    HeartbeatAction,
    HeartbeatResponse,
    InstanceListing,
    InstanceListRequest,
    InstanceStatusReport,
    ListedInstance,
    RegistrationResponse,
    SecretsFetch,
    SecretsReply,
)
from nvcf_mono.contracts.rpc import RpcError
from nvcf_mono.models.cluster import Cluster, ClusterHeartbeat, ClusterStatus
from nvcf_mono.models.common import now_iso, utc_now
from nvcf_mono.models.placement import Phase, SpecPlacement
from nvcf_mono.planes.control.context import Control
from nvcf_mono.planes.control.reconcile.ledger import FailurePolicy, apply_ack, apply_report
from nvcf_mono.planes.control.service import open_secrets
from nvcf_mono.planes.control.tasks import task_reports
from nvcf_mono.planes.control.telemetry import exports_of, worker_exports
from nvcf_mono.structure import evolve

_PHASE_STATE = {
    Phase.REQUESTED: states.STARTING,
    Phase.ACKNOWLEDGED: states.STARTING,
    Phase.STARTING: states.STARTING,
    Phase.RUNNING: states.RUNNING,
    Phase.TERMINATING: states.SHUTTING_DOWN,
}


def group_id(name: str) -> str:
    """A cluster group's id: stable for its name, so every node derives the same one."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"nvcf-mono:cluster-group:{name.lower()}"))


@final
class Icms:
    """The agent-facing responder."""

    def __init__(self, ctl: Control, log: logging.Logger) -> None:
        self._ctl = ctl
        self._log = log
        cfg = ctl.config.reconcile
        self._policy = FailurePolicy(
            backoff=cfg.retry_backoff, backoff_max=cfg.retry_backoff_max, kept=cfg.failures_kept
        )

    async def serve(self, *, task_status: TaskStatus[None]) -> None:
        endpoints: dict[str, rpc.Endpoint] = {
            "register": (ClusterRegistration, self.register),
            "heartbeat": (Heartbeat, self.heartbeat),
            "ack": (AckRequest, self.ack),
            "status": (InstanceStatusReport, self.status),
            "instances": (InstanceListRequest, self.instances),
        }
        handler = rpc.dispatcher(endpoints, lambda subject: subjects.icms_call_of(subject)[0])
        await self._ctl.bus.serve(
            subjects.ICMS_ALL, handler, queue=subjects.ICMS_QUEUE, concurrency=64, task_status=task_status
        )

    async def serve_secrets(self, *, task_status: TaskStatus[None]) -> None:
        handler = rpc.dispatcher({"fetch": (SecretsFetch, self.fetch_secrets)}, lambda _: "fetch")
        await self._ctl.bus.serve(
            subjects.SECRETS_FETCH, handler, queue=subjects.ICMS_QUEUE, concurrency=16, task_status=task_status
        )

    # ---- clusters ----------------------------------------------------------------------------------

    async def register(self, subject: str, reg: ClusterRegistration) -> RegistrationResponse:
        _, cluster_id = subjects.icms_call_of(subject)
        if reg.cluster_id != cluster_id:
            raise RpcError(400, f"registration for {reg.cluster_id!r} sent on the subject of {cluster_id!r}")
        default_account = self._ctl.config.default_account

        def change(current: Cluster | None) -> Cluster:
            now = now_iso()
            group = reg.cluster_group_name or (current.cluster_group_name if current else reg.cluster_name)
            if current is not None and current.source == "api":
                # Registered over REST first: keep what the operator set, take the agent's inventory.
                return evolve(
                    current,
                    gpus=reg.gpus,
                    k8s_version=reg.k8s_version,
                    nvca_version=reg.nvca_version,
                    status=ClusterStatus(reg.status)
                    if reg.status in ClusterStatus._value2member_map_
                    else current.status,
                    last_registered_at=now,
                )
            return Cluster(
                cluster_id=cluster_id,
                cluster_name=reg.cluster_name,
                cluster_group_name=group,
                cluster_group_id=group_id(group),
                nca_id=reg.nca_id or default_account,
                authorized_nca_ids=reg.authorized_nca_ids or (() if reg.nca_id else ("*",)),
                region=reg.region,
                cloud_provider=reg.cloud_provider,
                attributes=reg.attributes,
                capabilities=reg.capabilities,
                gpus=reg.gpus,
                nvca_version=reg.nvca_version,
                k8s_version=reg.k8s_version,
                status=ClusterStatus(reg.status)
                if reg.status in ClusterStatus._value2member_map_
                else ClusterStatus.READY,
                registered_at=current.registered_at if current else now,
                last_registered_at=now,
                source="agent",
            )

        cluster = await self._ctl.store.clusters.mutate(cluster_id, change)
        assert cluster is not None
        self._log.info(
            "cluster %s (%s) registered: %s",
            cluster.cluster_name,
            cluster_id,
            ", ".join(f"{g.capacity}x {g.name}" for g in cluster.gpus) or "no GPUs",
        )
        self._ctl.poke()
        return RegistrationResponse(
            cluster_id=cluster_id,
            cluster_group_id=cluster.cluster_group_id,
            cluster_group_name=cluster.cluster_group_name,
            worker_grpc_address=self._ctl.worker_grpc_address,
        )

    async def heartbeat(self, subject: str, beat: Heartbeat) -> HeartbeatResponse:
        _, cluster_id = subjects.icms_call_of(subject)
        store = self._ctl.store
        if await store.clusters.fetch(cluster_id) is None:
            return HeartbeatResponse(action=HeartbeatAction.REGISTER)
        was_healthy = (previous := store.health.get(cluster_id)) is not None and previous.healthy
        record = ClusterHeartbeat(
            cluster_id=cluster_id,
            status=beat.status,
            at=now_iso(),
            gpu_usage=beat.gpu_usage,
            maintenance_mode=beat.maintenance_mode,
            nvca_version=beat.nvca_version,
        )
        revision = await store.health.kv.put(cluster_id, record, ttl=self._ctl.config.cluster_heartbeat_ttl)
        store.health.mirror.note(cluster_id, record, revision)
        if record.healthy != was_healthy:
            self._ctl.poke()
        return HeartbeatResponse(action=HeartbeatAction.ACCEPTED, worker_grpc_address=self._ctl.worker_grpc_address)

    # ---- instance requests --------------------------------------------------------------------------

    def _ledger_key(self, function_version_id: str | None, spec_id: str | None, request_id: str) -> str:
        if function_version_id and spec_id:
            return buckets.spec_key(function_version_id, spec_id)
        for key, ledger in self._ctl.store.placements.items():
            if ledger.find(request_id) is not None:
                return key
        raise RpcError(404, f"unknown instance request {request_id!r}")

    async def ack(self, subject: str, req: AckRequest) -> Empty:
        if req.task_id is not None:
            await task_reports.ack(self._ctl, req.task_id, req.request_id)
            return Empty()
        key = self._ledger_key(req.function_version_id, req.gpu_specification_id, req.request_id)
        found = False

        def change(current: SpecPlacement | None) -> SpecPlacement | None:
            nonlocal found
            if current is None:
                raise Unchanged
            updated = apply_ack(current, req.request_id, utc_now())
            found = updated is not None
            if updated is None or updated == current:
                raise Unchanged
            return updated

        await self._ctl.store.placements.mutate(key, change)
        if not found:
            raise RpcError(404, f"instance request {req.request_id!r} is not wanted any more")
        return Empty()

    async def status(self, subject: str, report: InstanceStatusReport) -> Empty:
        if report.task_id is not None:
            if not await task_reports.status(self._ctl, report, self._log):
                return self._unknown(report)
            return Empty()
        try:
            key = self._ledger_key(report.function_version_id, report.gpu_specification_id, report.request_id)
        except RpcError:
            return self._unknown(report)
        known = False

        def change(current: SpecPlacement | None) -> SpecPlacement | None:
            nonlocal known
            if current is None:
                raise Unchanged
            updated = apply_report(current, report, utc_now(), self._policy)
            known = updated is not None
            if updated is None or updated == current:
                raise Unchanged
            return updated

        await self._ctl.store.placements.mutate(key, change)
        if not known:
            return self._unknown(report)
        if report.instance_state in states.GONE_STATES and report.status != states.TERMINATED_BY_USER:
            output = report.health_info.error_log[-200:] if report.health_info else ""
            self._log.info(
                "instance %s (request %s) ended: %s%s",
                report.instance_id,
                report.request_id,
                report.termination_cause or report.instance_state,
                f"; the end of its output: {output!r}" if output else "",
            )
        self._ctl.poke()
        return Empty()

    def _unknown(self, report: InstanceStatusReport) -> Empty:
        """An instance the control plane does not want: 412 tells the agent to stop it (reference §4)."""
        if report.instance_state in states.GONE_STATES:
            return Empty()
        raise RpcError(412, f"instance request {report.request_id!r} is not wanted; terminate instance")

    async def instances(self, subject: str, request: InstanceListRequest) -> InstanceListing:
        _, cluster_id = subjects.icms_call_of(subject)
        listed = [
            ListedInstance(
                instance_id=inst.instance_id, request_id=inst.request_id, instance_state=_PHASE_STATE[inst.phase]
            )
            for ledger in self._ctl.store.placements.values()
            for inst in ledger.instances
            if inst.cluster_id == cluster_id
        ]
        listed += task_reports.listed(self._ctl, cluster_id)
        return InstanceListing(instances=tuple(listed))

    # ---- secrets for instances ----------------------------------------------------------------------

    async def fetch_secrets(self, subject: str, req: SecretsFetch) -> SecretsReply:
        """Secrets of the version (or task) a worker token belongs to, over its account's; never in creation
        messages.
        """
        try:
            claims: dict[str, Any] = self._ctl.tokens.verify(req.worker_token, WORKER)
        except InvalidToken as err:
            raise RpcError(401, f"invalid worker token: {err}") from err
        own = (
            buckets.task_secrets_key(str(claims["tid"]))
            if claims.get("tid")
            else buckets.function_secrets_key(str(claims["fid"]), str(claims["fvid"]))
        )
        values: dict[str, Any] = {}
        for key in (buckets.account_secrets_key(str(claims["nca"])), own):
            sealed = await self._ctl.store.secrets.fetch(key)
            if sealed is not None:
                values.update(open_secrets(self._ctl, key, sealed))
        return SecretsReply(secrets=values, telemetry_exports=self._telemetry_exports(claims))

    def _telemetry_exports(self, claims: Mapping[str, Any]) -> str | None:
        """The workload's ``NVCF_TELEMETRY_EXPORTS`` with the telemetry secrets as they are now."""
        store = self._ctl.store
        if claims.get("tid"):
            task = store.tasks.get(str(claims["tid"]))
            nca, chosen = (task.nca_id, task.telemetries) if task is not None else ("", None)
        else:
            fv = store.functions.get(buckets.version_key(str(claims["fid"]), str(claims["fvid"])))
            nca, chosen = (fv.nca_id, fv.telemetries) if fv is not None else ("", None)
        exports = exports_of(store, self._ctl.keyring, nca, chosen, self._ctl.config.telemetry_networks)
        return worker_exports(exports) if exports else None
