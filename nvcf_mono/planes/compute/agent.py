"""The cluster agent (NVCA): registers and heartbeats, takes creation and termination messages from its
cluster's durables, keeps each instance request in NVCA's state machine, and compares its instances
with the control plane's view (reference compute-plane §1, §2, §4, §6). ``supervisor.py`` runs the
instances, ``reporter.py`` reports them.

Creation follows the reference's ack flow: record the request in KV, have the control plane
acknowledge it, ack the NATS message, then launch. A redelivered message finds its record and starts
nothing. A restarted agent reads its records back, takes over what still runs and reports the rest.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path

import anyio
from anyio.abc import TaskGroup, TaskStatus

from nvcf_mono.backoff import Backoff
from nvcf_mono.bus.api import Bus, Delivery
from nvcf_mono.bus.errors import BusError
from nvcf_mono.contracts import states, streams, subjects
from nvcf_mono.contracts.agent import AgentRequest, RequestStatus
from nvcf_mono.contracts.messages import (
    ClusterRegistration,
    CreationMessage,
    Heartbeat,
    HeartbeatAction,
    InstanceListing,
    MessageError,
    TerminationMessage,
    decode,
)
from nvcf_mono.contracts.rpc import RpcError
from nvcf_mono.models.cluster import MaintenanceMode
from nvcf_mono.models.common import now_iso, parse_iso
from nvcf_mono.planes.compute import requests
from nvcf_mono.planes.compute.backends import Backend, WorkerEndpoint
from nvcf_mono.planes.compute.config import ClusterSettings, ComputeConfig
from nvcf_mono.planes.compute.control import ControlClient
from nvcf_mono.planes.compute.gpus import Allocation, Allocator, Inventory, discover, registered_gpus
from nvcf_mono.planes.compute.health import LaunchFailure
from nvcf_mono.planes.compute.identity import ClusterIdentity
from nvcf_mono.planes.compute.queries import Queries
from nvcf_mono.planes.compute.reporter import Reporter
from nvcf_mono.planes.compute.requests import RequestBook, new_request, refused
from nvcf_mono.planes.compute.supervisor import BY_USER, Supervisor, allocation_of
from nvcf_mono.structure import evolve


class ClusterAgent:
    """The agent of one cluster: :meth:`prepare`, then :meth:`run` until :meth:`shutdown`."""

    def __init__(
        self,
        *,
        bus: Bus,
        cluster: ClusterSettings,
        ident: ClusterIdentity,
        config: ComputeConfig,
        backend: Backend,
        state_dir: Path,
        log: logging.Logger,
        version: str,
        endpoint: WorkerEndpoint | None = None,
    ) -> None:
        self.bus = bus
        self.endpoint = endpoint or WorkerEndpoint()
        self.cluster = cluster
        self.ident = ident
        self.config = config
        self.backend = backend
        self.state_dir = state_dir
        self.log = log
        self.version = version
        self.cluster_id = ident.cluster_id
        self.book = RequestBook(bus, self.cluster_id, finished_ttl=config.finished_ttl, log=log)
        self.control = ControlClient(bus, self.cluster_id, timeout=config.call_timeout)
        self.allocator = Allocator(Inventory(models=()))
        self.supervisor = Supervisor(
            cluster_id=self.cluster_id,
            book=self.book,
            backend=backend,
            allocator=self.allocator,
            config=config,
            state_dir=state_dir,
            log=log,
            changed=self._report_soon,
            freed=self._beat_soon,
        )
        self.reporter = Reporter(
            book=self.book, control=self.control, supervisor=self.supervisor, config=config, log=log
        )
        self.registered_at: str | None = None
        self.last_heartbeat_at: str | None = None
        self._intake = anyio.CancelScope()
        self._beat_wanted = anyio.Event()
        self._confirming: set[str] = set()
        self._registered = False
        self._records: list[AgentRequest] = []
        self._tg: TaskGroup | None = None

    def _report_soon(self) -> None:
        self.reporter.wake()

    def _beat_soon(self) -> None:
        self._beat_wanted.set()

    # ---- lifecycle ---------------------------------------------------------------------------------

    async def prepare(self) -> None:
        """Discover the GPUs, ensure the durables, read the records back (raises BusError: try again)."""
        self.allocator.replace_inventory(await self._discover())
        await self._ensure_consumers()
        self._records = await self.book.load()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Serve until :meth:`shutdown` (or cancelled)."""
        records, inventory = self._records, self.allocator.inventory
        async with anyio.create_task_group() as tg:
            self._tg = tg
            self.supervisor.bind(tg)
            await self._recover(records)
            await tg.start(Queries(self).serve)
            tg.start_soon(self._registration)
            tg.start_soon(self.reporter.run)
            tg.start_soon(self._sync_loop)
            tg.start_soon(self._intake_loop)
            self.log.info(
                "agent of cluster %s (%s) on backend %s: %s; %d request(s) taken over",
                self.ident.name,
                self.cluster_id,
                self.backend.name,
                ", ".join(f"{m.capacity}x {m.name} ({m.source})" for m in inventory.models) or "no GPUs",
                len(records),
            )
            task_status.started()

    async def shutdown(self, *, stop_instances: bool, grace: float) -> None:
        """Take no more work; stop the instances (or leave them to the next start); end :meth:`run`."""
        self._intake.cancel()
        # Cordoned first, so the control plane places nothing here (the instances stopped next included)
        # while this agent is away; its next start's heartbeat lifts it.
        with anyio.move_on_after(min(self.config.call_timeout, 2.0)):
            try:
                await self.control.heartbeat(self._heartbeat())
            except (RpcError, BusError) as err:
                self.log.debug("cannot say the cluster is cordoned while stopping (%s)", err)
        if stop_instances:
            await self.supervisor.stop_all(states.SERVICE_MAINTENANCE, grace)
            with anyio.move_on_after(min(self.config.call_timeout, 2.0)):
                await self.reporter.round(full=False)
        if self._tg is not None:
            self._tg.cancel_scope.cancel()

    # ---- recovery after a restart ----------------------------------------------------------------------

    async def _recover(self, records: list[AgentRequest]) -> None:
        # First the processes of this cluster no record holds (the agent died between starting one and
        # recording it): they go, so nothing runs twice.
        live = [i for r in records for i in r.instances if not i.gone]
        swept = await self.backend.sweep(self.cluster_id, self.state_dir, live)
        if swept:
            self.log.warning("stopped unrecorded processes of instance(s) %s", ", ".join(swept))
        assert self._tg is not None
        for req in records:
            for inst in req.instances:
                if not inst.gone and inst.devices:
                    self.allocator.reserve(allocation_of(req, inst))
            if req.status is RequestStatus.RECEIVED:
                self._tg.start_soon(self._confirm, req.request_id, None)
                continue
            for inst in req.instances:
                if not inst.gone:
                    self.supervisor.supervise(req, inst, adopt=inst.launched_at is not None)
        self.reporter.wake()

    # ---- registration and heartbeats ---------------------------------------------------------------

    def registration(self) -> ClusterRegistration:
        """What the cluster registers: GPUs and instance types with NVCA's naming, attributes, capabilities."""
        facts = self.backend.cluster_facts(self.cluster_id)
        return ClusterRegistration(
            cluster_id=self.cluster_id,
            cluster_name=self.ident.name,
            cluster_group_name=self.ident.group,
            region=self.ident.region,
            gpus=registered_gpus(self.allocator.inventory, self.cluster.cloud_provider),
            nca_id=self.cluster.nca_id,
            cloud_provider=self.cluster.cloud_provider,
            attributes=facts.attributes if facts.attributes is not None else self.cluster.attributes,
            capabilities=facts.capabilities if facts.capabilities is not None else self.backend.capabilities,
            authorized_nca_ids=self.cluster.authorized_nca_ids,
            nvca_version=self.version,
            k8s_version=facts.kubernetes_version,
        )

    def _note_endpoint(self, address: str | None) -> None:
        if address and address != self.endpoint.address:
            if self.endpoint.address is not None:
                self.log.info("instances now reach the platform at %s (was %s)", address, self.endpoint.address)
            self.endpoint.address = address

    async def _registration(self) -> None:
        cfg = self.config
        backoff = Backoff(0.2, min(cfg.retry_backoff_max, cfg.heartbeat_interval))
        registered_mono = 0.0
        inventory_mono = time.monotonic()
        failing = False
        while True:
            try:
                if time.monotonic() - inventory_mono > cfg.inventory_interval:
                    inventory_mono = time.monotonic()
                    await self._rediscover()
                if not self._registered or time.monotonic() - registered_mono > cfg.reregister_interval:
                    reply = await self.control.register(self.registration())
                    self._registered, registered_mono, self.registered_at = True, time.monotonic(), now_iso()
                    self._note_endpoint(reply.worker_grpc_address)
                    self.log.info("registered as %s in group %s", reply.cluster_id, reply.cluster_group_name)
                answer = await self.control.heartbeat(self._heartbeat())
                self.last_heartbeat_at = now_iso()
                self._note_endpoint(answer.worker_grpc_address)
                if answer.action is HeartbeatAction.REGISTER:
                    self._registered = False
                    continue
                if answer.action is HeartbeatAction.SELF_DESTRUCT:
                    self.log.error("the control plane asked this agent to self-destruct; ignoring it")
                if failing:
                    self.log.info("the control plane answers again")
                failing = False
                backoff.reset()
            except (RpcError, BusError) as err:
                if not failing and not self._intake.cancel_called:
                    self.log.warning("cannot reach the control plane (%s); retrying", err)
                elif not failing:  # the host is stopping: its control plane may have gone first
                    self.log.debug("cannot reach the control plane while stopping (%s)", err)
                failing = True
                await anyio.sleep(backoff.next())
                continue
            with anyio.move_on_after(cfg.heartbeat_interval):
                await self._beat_wanted.wait()
            self._beat_wanted = anyio.Event()

    def _heartbeat(self) -> Heartbeat:
        # Cordoned once stopping: no new work while this agent is away.
        cordon = MaintenanceMode.CORDON_ONLY if self._intake.cancel_called else MaintenanceMode.NONE
        return Heartbeat(
            status="healthy", gpu_usage=self.allocator.usage(), maintenance_mode=cordon, nvca_version=self.version
        )

    async def _discover(self) -> Inventory:
        """The GPUs: the configured ones (static), the backend's view (a Kubernetes cluster's nodes), or
        nvidia-smi's.
        """
        if self.cluster.gpu_discovery != "static":
            found = await self.backend.discover(self.cluster_id)
            if found is not None:
                return found
        return await anyio.to_thread.run_sync(discover, self.cluster.gpu_discovery, self.cluster.gpus)

    async def _rediscover(self) -> None:
        if self.cluster.gpu_discovery == "static":
            return
        facts = self.backend.cluster_facts(self.cluster_id)
        found = await self._discover()
        if found != self.allocator.inventory:
            self.log.info("the GPUs changed: %s", ", ".join(f"{m.capacity}x {m.name}" for m in found.models))
            self.allocator.replace_inventory(found)
            self._registered = False
        if self.backend.cluster_facts(self.cluster_id) != facts:
            self.log.info("the cluster's attributes or capabilities changed: registering again")
            self._registered = False

    # ---- intake: creation and termination messages -------------------------------------------------

    async def _intake_loop(self) -> None:
        with self._intake:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._consume, subjects.CREATE_STREAM, self._on_creation)
                tg.start_soon(self._consume, subjects.TERMINATE_STREAM, self._on_termination)

    async def _consume(self, stream: str, handler: Callable[[Delivery], Awaitable[None]]) -> None:
        durable = subjects.agent_durable(stream, self.cluster_id)
        cfg = self.config
        while True:
            try:
                async with (
                    anyio.create_task_group() as handlers,
                    self.bus.stream(stream).consume(
                        durable,
                        batch=min(cfg.max_inflight, 10),
                        max_inflight=cfg.max_inflight,
                        fetch_timeout=cfg.fetch_timeout,
                    ) as deliveries,
                ):
                    async for delivery in deliveries:
                        handlers.start_soon(self._handle, handler, delivery)
            except BusError as err:
                self.log.warning("consuming %s failed (%s); again in 1s", durable, err)
                await anyio.sleep(1.0)
                try:
                    await self._ensure_consumers()
                except BusError:
                    pass

    async def _ensure_consumers(self) -> None:
        """The cluster's durables ``<stream>-<clusterId>`` (the streams are the control plane's)."""
        for stream, consumer in (
            (streams.CREATE_STREAM, streams.create_consumer(self.cluster_id)),
            (streams.TERMINATE_STREAM, streams.terminate_consumer(self.cluster_id)),
        ):
            await self.bus.ensure_stream(stream)
            await self.bus.stream(stream.name).ensure_consumer(consumer)

    async def _handle(self, handler: Callable[[Delivery], Awaitable[None]], delivery: Delivery) -> None:
        try:
            await handler(delivery)
        except Exception as err:
            if isinstance(err, BusError):
                self.log.warning("message on %s not handled (%s); it will be delivered again", delivery.subject, err)
            else:
                self.log.exception("message on %s failed; it will be delivered again", delivery.subject)
            try:
                await delivery.nak(1.0)
            except BusError:
                pass

    async def _on_creation(self, delivery: Delivery) -> None:
        try:
            msg = decode(CreationMessage, delivery.data)
        except MessageError as err:
            self.log.error("dropping an unreadable creation message on %s: %s", delivery.subject, err)
            await delivery.term()
            return
        known = await self.book.known(msg.request_id)
        if known is not None:
            # A redelivery: the record has it, so it never starts a second instance. A request whose
            # confirmation was cut short (a bus failure) is confirmed now.
            self.log.info("creation message for request %s again: already held", msg.request_id)
            if known.status is RequestStatus.RECEIVED and known.finished_at is None:
                await self._confirm(msg.request_id, delivery)
            else:
                await delivery.ack()
            return
        allocations = self._allocate(msg)
        if allocations is None:
            model = self.allocator.inventory.model(msg.gpu_type)
            largest = max((len(n.devices) for n in model.nodes), default=0) if model is not None else 0
            if largest >= max(msg.requested_gpu_count, 1):
                # A race with the control plane's view of capacity: try again later.
                self.log.info(
                    "request %s needs %d %s GPU(s), %d free: redelivered in %gs",
                    msg.request_id,
                    msg.gpus_needed,
                    msg.gpu_type,
                    self.allocator.free(msg.gpu_type),
                    self.config.capacity_backoff,
                )
                await delivery.nak(self.config.capacity_backoff)
                return
        req = new_request(msg, self.cluster_id, now_iso())
        if allocations is not None:
            pairs = zip(req.instances, allocations, strict=True)
            req = evolve(req, instances=tuple(evolve(i, node=a.node, devices=a.devices) for i, a in pairs))
        if not await self.book.create(req):
            for allocation in allocations or ():
                self.allocator.release(allocation)
            await delivery.ack()
            return
        self._beat_soon()
        await self._confirm(msg.request_id, delivery)

    def _allocate(self, msg: CreationMessage) -> list[Allocation] | None:
        """GPUs for every instance of a request, all or none (the capacity safety net, by the message's gpuType)."""
        taken: list[Allocation] = []
        for _ in range(max(msg.instance_count, 1)):
            got = self.allocator.allocate(msg.gpu_type, max(msg.requested_gpu_count, 1))
            if got is None:
                for allocation in taken:
                    self.allocator.release(allocation)
                return None
            taken.append(got)
        return taken

    def _cannot_run(self, req: AgentRequest) -> LaunchFailure | None:
        """Why a recorded request will fail without starting: a workload the backend refuses, or no node fits."""
        msg = req.message
        refusal = self.backend.refuse(msg)
        if refusal is not None:
            return refusal
        if any(not i.devices for i in req.instances):  # GPUs are given before a request is recorded
            return LaunchFailure(
                cause=states.NO_CAPACITY,
                detail=f"cluster {self.ident.name} has no node with {max(msg.requested_gpu_count, 1)} "
                f"{msg.gpu_type} GPU(s)",
            )
        return None

    async def _confirm(self, request_id: str, delivery: Delivery | None) -> None:
        """Have the control plane acknowledge a recorded request, ack its message, then launch it."""
        if request_id in self._confirming:
            if delivery is not None:
                await delivery.ack()
            return
        self._confirming.add(request_id)
        try:
            await self._confirm_once(request_id, delivery)
        finally:
            self._confirming.discard(request_id)

    async def _confirm_once(self, request_id: str, delivery: Delivery | None) -> None:
        pause = 0.2
        while True:
            req = self.book.get(request_id)
            if req is None:
                if delivery is not None:
                    await delivery.ack()
                return
            try:
                await self.control.ack(req)
                break
            except RpcError as err:
                if err.code < 500:
                    # The control plane does not want it (any more): ack the message and drop the request.
                    self.log.info("request %s refused by the control plane: %s", request_id, err.message)
                    await self._drop(req, err.message, delivery)
                    return
                self.log.warning("acknowledging request %s failed (%s); retrying", request_id, err)
            except BusError as err:
                self.log.warning("acknowledging request %s failed (%s); retrying", request_id, err)
            if delivery is not None:
                try:
                    await delivery.in_progress()
                except BusError:
                    pass
            await anyio.sleep(pause)
            pause = min(pause * 2, self.config.retry_backoff_max)
        stamp = now_iso()
        req = await self.book.update(
            request_id, lambda r: evolve(r, status=RequestStatus.PENDING, acked_at=stamp, updated_at=stamp)
        )
        if delivery is not None:
            try:
                await delivery.ack_sync()
            except BusError as err:
                self.log.info("ack of request %s's message failed (%s): its redelivery is recognised", request_id, err)
        failure = self._cannot_run(req) if req is not None else None
        for instance_id in [i.instance_id for i in req.instances] if req is not None else []:
            current = self.book.get(request_id)
            inst = current.instance(instance_id) if current is not None else None
            if current is None or inst is None or inst.gone:
                continue  # stopped meanwhile
            if failure is not None:
                await self.supervisor.fail(request_id, instance_id, failure)
            else:
                self.supervisor.supervise(current, inst, adopt=False)
        self.reporter.wake()

    async def _drop(self, req: AgentRequest, reason: str, delivery: Delivery | None) -> None:
        for inst in req.instances:
            if not inst.gone:
                self.supervisor.release(req, inst)
        await self.book.finish(refused(req, reason, now_iso()))
        if delivery is not None:
            await delivery.ack()
        # A request refused because it is being terminated is then forgotten at once, not after a timeout.
        fvid = req.message.function_details.function_version_id if req.message.function_details else None
        await self.reporter.nothing_runs(req.request_id, [i.instance_id for i in req.instances], fvid)

    async def _on_termination(self, delivery: Delivery) -> None:
        try:
            msg = decode(TerminationMessage, delivery.data)
        except MessageError as err:
            self.log.error("dropping an unreadable termination message on %s: %s", delivery.subject, err)
            await delivery.term()
            return
        targets: list[tuple[str, str]] = []
        unknown: list[str] = []
        for request_id in msg.request_ids:
            req = self.book.get(request_id)
            if req is None:
                unknown.append(request_id)
            else:
                targets.extend((request_id, i.instance_id) for i in req.instances)
        for instance_id in msg.instance_ids:
            holder = next((r for r in self.book if r.instance(instance_id) is not None), None)
            if holder is not None:
                targets.append((holder.request_id, instance_id))
        # The intent is stored before the message is acked: a restarted agent still stops them.
        for request_id, instance_id in dict.fromkeys(targets):
            await self.supervisor.stop(request_id, instance_id, BY_USER)
        await delivery.ack()
        for request_id in unknown:
            if await self.book.known(request_id) is None:
                # Never seen here (or long forgotten): nothing runs; tell the control plane so.
                ids = requests.instance_ids(request_id, 1)
                await self.reporter.nothing_runs(request_id, ids, msg.function_version_id)

    # ---- reconciliation with the control plane's view ----------------------------------------------

    async def _sync_loop(self) -> None:
        collected = -1e9
        while True:
            if time.monotonic() - collected > max(self.config.finished_ttl / 4, 60.0):
                collected = time.monotonic()
                await self._collect_garbage()
            await anyio.sleep(self.config.sync_interval)
            try:
                listing = await self.control.instances()
            except (RpcError, BusError) as err:
                self.log.info("cannot compare instances with the control plane: %s", err)
                continue
            await self.sync(listing, time.time())

    async def sync(self, listing: InstanceListing, now: float) -> None:
        """Stop what the control plane no longer wants; report again what it sees differently."""
        wanted = {i.request_id: i.instance_state for i in listing.instances}
        for req in list(self.book):
            young = now - parse_iso(req.created_at).timestamp() < self.config.sync_grace
            if req.status is RequestStatus.RECEIVED or young:
                continue
            listed = wanted.get(req.request_id)
            for inst in req.instances:
                if inst.gone or inst.stop is not None:
                    continue
                if listed is None or listed == states.SHUTTING_DOWN:
                    self.log.info(
                        "instance %s: the control plane %s; stopping it",
                        inst.instance_id,
                        "does not know it" if listed is None else "is shutting it down",
                    )
                    await self.supervisor.stop(req.request_id, inst.instance_id, states.SYNC_ACTION)
                elif listed != inst.state and {listed, inst.state} <= {states.STARTING, states.RUNNING}:
                    self.reporter.force(inst.instance_id)

    async def _collect_garbage(self) -> None:
        """Remove the directories (logs) of instances whose requests are no longer remembered."""
        root = self.state_dir / "instances"
        if not root.is_dir():
            return
        try:
            remembered = await self.book.remembered()
        except BusError:
            return
        keep = {i.instance_id for r in [*self.book, *remembered] for i in r.instances}
        cutoff = time.time() - 60
        for entry in sorted(root.iterdir()):
            try:
                old = entry.stat().st_mtime < cutoff
            except OSError:
                continue
            if entry.name not in keep and old:
                await anyio.to_thread.run_sync(partial(shutil.rmtree, entry, ignore_errors=True))
