"""A scripted cluster agent on the real bus, for testing the control plane without a compute plane.

It registers a cluster, heartbeats, consumes its creation and termination durables exactly as a
real agent does, and answers each creation by a behaviour the test picks (run it, fail it, leave
it starting, or nothing), reporting instance status on ``nvcf.icms.status``. It launches nothing.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

import aiohttp
import anyio
import anyio.abc
import attrs
from anyio.abc import TaskStatus

from nvcf_mono.backoff import Backoff
from nvcf_mono.bus.api import Bus
from nvcf_mono.bus.errors import BusError
from nvcf_mono.contracts import rpc, states, streams, subjects
from nvcf_mono.contracts.env import NVCF_FQDN_GRPC
from nvcf_mono.contracts.messages import (
    AckRequest,
    ClusterRegistration,
    CreationMessage,
    Empty,
    Heartbeat,
    HeartbeatResponse,
    InstanceHealthInfo,
    InstanceStatusReport,
    RegistrationResponse,
    RequestState,
    TerminationMessage,
    decode,
)
from nvcf_mono.models.cluster import ClusterGpu, GpuUsage, InstanceType, MaintenanceMode, instance_type_name
from nvcf_mono.models.common import now_iso
from nvcf_mono.ports import spare_port

Behaviour = Literal["run", "fail", "start", "ignore", "fail-permanent", "launch"]

log = logging.getLogger("nvcf_mono.testing.agent")
R = TypeVar("R")
#: Times an RPC is sent while the bus does not answer.
RPC_ATTEMPTS = 5


def gpu_inventory(
    gpu: str, per_node: int, nodes: int = 1, *, provider: str = "ON-PREM", capabilities: int | None = None
) -> ClusterGpu:
    """A GPU with NVCA's instance types: ``_1x``, ``_2x``, ... up to the node's GPU count."""
    sizes = sorted({n for n in (1, 2, 4, 8, 16) if n < per_node} | {per_node})
    types = tuple(
        InstanceType(
            name=instance_type_name(provider, gpu, n),
            value=f"{provider}.GPU.{gpu}",
            gpu_count=n,
            max_instances=(per_node // n) * nodes,
            default=i == 0,
        )
        for i, n in enumerate(sizes)
    )
    return ClusterGpu(
        name=gpu, capacity=capabilities if capabilities is not None else per_node * nodes, instance_types=types
    )


@attrs.define(eq=False)
class Instance:
    """One instance the scripted agent holds."""

    request_id: str
    instance_id: str
    message: CreationMessage
    state: str


class ScriptedAgent:
    """A fake NVCA on the real bus (``await tg.start(agent.run)``)."""

    def __init__(
        self,
        bus: Bus,
        *,
        cluster_id: str,
        cluster_name: str,
        gpus: Sequence[ClusterGpu],
        region: str = "us-west-1",
        behaviour: Behaviour | Callable[[CreationMessage], Behaviour] = "run",
        heartbeat_interval: float = 0.5,
        attributes: tuple[str, ...] = (),
        capabilities: tuple[str, ...] = (),
        cluster_group_name: str | None = None,
        healthy: bool = True,
        launcher: ProcessLauncher | None = None,
    ) -> None:
        self.bus = bus
        self.cluster_id = cluster_id
        self.cluster_name = cluster_name
        self.gpus = tuple(gpus)
        self.region = region
        self.behaviour = behaviour
        self.heartbeat_interval = heartbeat_interval
        self.attributes = attributes
        self.capabilities = capabilities
        self.cluster_group_name = cluster_group_name
        self.healthy = healthy
        #: What its heartbeats say of maintenance (CordonOnly: place nothing new here).
        self.maintenance = MaintenanceMode.NONE
        self.launcher = launcher
        self.creations: list[CreationMessage] = []
        self.terminations: list[TerminationMessage] = []
        self.instances: dict[str, Instance] = {}
        self.changed = anyio.Event()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        await self.register()
        for spec in (streams.create_consumer(self.cluster_id), streams.terminate_consumer(self.cluster_id)):
            stream = (
                streams.CREATE_STREAM if spec.durable.startswith(subjects.CREATE_STREAM) else streams.TERMINATE_STREAM
            )
            await self.bus.ensure_stream(stream)
            await self.bus.stream(stream.name).ensure_consumer(spec)
        await self.heartbeat()
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._heartbeats)
                tg.start_soon(self._creations)
                tg.start_soon(self._terminations)
                task_status.started()
        finally:
            if self.launcher is not None:
                await self.launcher.stop_all()

    async def register(self) -> RegistrationResponse:
        reg = ClusterRegistration(
            cluster_id=self.cluster_id,
            cluster_name=self.cluster_name,
            cluster_group_name=self.cluster_group_name,
            region=self.region,
            gpus=self.gpus,
            attributes=self.attributes,
            capabilities=self.capabilities,
        )
        return await rpc.call(self.bus, subjects.icms_subject("register", self.cluster_id), reg, RegistrationResponse)

    async def heartbeat(self) -> None:
        used: dict[str, int] = {}
        for inst in self.instances.values():
            if inst.state not in states.GONE_STATES:
                used[inst.message.gpu_type] = used.get(inst.message.gpu_type, 0) + inst.message.gpus_needed
        usage = {
            g.name: GpuUsage(
                capacity=g.capacity, allocated=used.get(g.name, 0), available=g.capacity - used.get(g.name, 0)
            )
            for g in self.gpus
        }
        beat = Heartbeat(
            status="healthy" if self.healthy else "unhealthy", gpu_usage=usage, maintenance_mode=self.maintenance
        )
        await rpc.call(self.bus, subjects.icms_subject("heartbeat", self.cluster_id), beat, HeartbeatResponse)

    async def _heartbeats(self) -> None:
        while True:
            await anyio.sleep(self.heartbeat_interval)
            try:
                await self.heartbeat()
            except Exception as err:  # a test agent keeps beating through bus hiccups
                log.debug("heartbeat failed: %s", err)

    def _notify(self) -> None:
        self.changed.set()
        self.changed = anyio.Event()

    async def _call(self, kind: Literal["ack", "status"], body: Any, response: type[R]) -> R:
        """One RPC to the control plane, sent again while the bus does not answer (as the real agent does:
        a busy store may answer late); the control plane's refusals (RpcError) are raised at once.
        """
        subject = subjects.icms_subject(kind, self.cluster_id)
        backoff = Backoff(0.5, 4.0)
        for _ in range(RPC_ATTEMPTS - 1):
            try:
                return await rpc.call(self.bus, subject, body, response)
            except BusError as err:
                log.info("%s for cluster %s: %s; asking again", kind, self.cluster_id, err)
                await anyio.sleep(backoff.next())
        return await rpc.call(self.bus, subject, body, response)  # the last one's failure is the caller's

    async def _creations(self) -> None:
        async with (
            anyio.create_task_group() as launches,
            self.bus.stream(subjects.CREATE_STREAM).consume(
                subjects.agent_durable(subjects.CREATE_STREAM, self.cluster_id), batch=10, fetch_timeout=1.0
            ) as deliveries,
        ):
            async for delivery in deliveries:
                msg = decode(CreationMessage, delivery.data)
                if msg.request_id in self.instances or any(c.request_id == msg.request_id for c in self.creations):
                    await delivery.ack()  # a redelivery: never a second instance
                    continue
                self.creations.append(msg)
                behaviour = self.behaviour(msg) if callable(self.behaviour) else self.behaviour
                if behaviour == "ignore":
                    await delivery.ack()
                    self._notify()
                    continue
                try:
                    await self._call(
                        "ack",
                        AckRequest(
                            request_id=msg.request_id,
                            instance_count=msg.instance_count,
                            message_batch_id=msg.message_batch_id,
                            function_version_id=msg.function_details.function_version_id
                            if msg.function_details
                            else None,
                            gpu_specification_id=msg.gpu_specification_id,
                        ),
                        Empty,
                    )
                except rpc.RpcError as err:
                    await delivery.ack()
                    log.info("ack of %s refused: %s", msg.request_id, err)
                    self._notify()
                    continue
                await delivery.ack()
                inst = Instance(
                    request_id=msg.request_id, instance_id=f"0-sr-{msg.request_id}", message=msg, state="new"
                )
                self.instances[msg.request_id] = inst
                await self.report(msg.request_id, states.STARTING)
                if behaviour == "run":
                    await self.report(msg.request_id, states.RUNNING)
                elif behaviour == "fail":
                    await self.report(
                        msg.request_id, states.CONTAINER_RESTART_LOOP, error="the inference server exited with code 1"
                    )
                elif behaviour == "fail-permanent":
                    await self.report(msg.request_id, states.IMAGE_PULL_ISSUES, error="image 'nope' not found")
                elif behaviour == "launch":
                    launches.start_soon(self._launch, msg)
                self._notify()

    async def _launch(self, msg: CreationMessage) -> None:
        assert self.launcher is not None, "behaviour 'launch' needs a launcher"
        launched = await self.launcher.start(msg)
        try:
            await self.launcher.wait_ready(launched)
        except RuntimeError as err:
            await self.launcher.stop(msg.request_id)
            await self.report(msg.request_id, states.FAILED, error=str(err))
            return
        await self.report(msg.request_id, states.RUNNING)
        if self.launcher.restart_inference:
            await self.launcher.keep_inference(msg.request_id)

    async def _terminations(self) -> None:
        async with self.bus.stream(subjects.TERMINATE_STREAM).consume(
            subjects.agent_durable(subjects.TERMINATE_STREAM, self.cluster_id), batch=10, fetch_timeout=1.0
        ) as deliveries:
            async for delivery in deliveries:
                msg = decode(TerminationMessage, delivery.data)
                self.terminations.append(msg)
                await delivery.ack()
                for request_id in msg.request_ids:
                    inst = self.instances.get(request_id)
                    if inst is None:
                        await self._nothing_runs(request_id, msg.function_version_id)
                    elif inst.state not in states.GONE_STATES:
                        if self.launcher is not None:
                            await self.launcher.stop(request_id)
                        await self.report(request_id, states.TERMINATED, status=states.TERMINATED_BY_USER)
                self._notify()

    async def _nothing_runs(self, request_id: str, function_version_id: str | None) -> None:
        """A termination of a request never started here (its creation not taken yet): say it is gone, as NVCA."""
        report = InstanceStatusReport(
            request_id=request_id,
            instance_id=f"0-sr-{request_id}",
            status=states.TERMINATED_BY_USER,
            instance_state=states.TERMINATED,
            request_state=RequestState.CLOSED,
            action="TerminateInstances",
            at=now_iso(),
            function_version_id=function_version_id,
        )
        try:
            await self._call("status", report, Empty)
        except rpc.RpcError as err:
            log.info("report of %s as never started refused: %s", request_id, err)

    async def report(self, request_id: str, state: str, *, error: str | None = None, status: str | None = None) -> None:
        """Send one instance status report (a test may call this to script a change)."""
        inst = self.instances[request_id]
        inst.state = state
        gone = state in states.GONE_STATES
        msg = inst.message
        report = InstanceStatusReport(
            request_id=request_id,
            instance_id=inst.instance_id,
            status=status
            or (
                states.TERMINATED_BY_SERVICE
                if gone
                else states.FULFILLED
                if state == states.RUNNING
                else states.PENDING_FULFILLMENT
            ),
            instance_state=state,
            request_state=RequestState.CLOSED if gone else RequestState.ACTIVE,
            action="RequestSpotInstances",
            at=now_iso(),
            termination_cause=state if gone and state in states.BAD_STATES else None,
            health_info=InstanceHealthInfo(error_log=error, error_source="utils") if error else None,
            function_id=msg.function_details.function_id if msg.function_details else None,
            function_version_id=msg.function_details.function_version_id if msg.function_details else None,
            gpu_specification_id=msg.gpu_specification_id,
        )
        try:
            await self._call("status", report, Empty)
        except rpc.RpcError as err:
            if err.code == 412 and not gone:
                inst.state = states.TERMINATED
            else:
                raise

    def live(self) -> list[Instance]:
        return [i for i in self.instances.values() if i.state not in states.GONE_STATES]


def inference_command(spec_env: Mapping[str, str], port: int) -> list[str]:
    """The test inference server of an instance: the gRPC echo server for gRPC functions, else the HTTP one."""
    grpc = spec_env.get("INFERENCE_URL") == "/grpc" or spec_env.get("INFERENCE_PROTOCOL") == "grpc"
    if grpc:
        return [sys.executable, "-m", "nvcf_mono.examples.grpc_echo", "--port", str(port), "--test-hooks"]
    return [sys.executable, "-m", "nvcf_mono.testing.echo_server", "--port", str(port)]


@attrs.define(eq=False)
class Launched:
    """The processes of one launched instance."""

    inference: anyio.abc.Process
    worker: anyio.abc.Process
    health_port: int
    inference_port: int
    log: Path
    #: How the inference server was started (to start it again).
    inference_argv: list[str] = attrs.field(factory=list)
    inference_env: dict[str, str] = attrs.field(factory=dict)
    #: Times the inference server was started again after it exited.
    restarts: int = 0


class ProcessLauncher:
    """Starts an instance as the local backend will: the inference server and ``nvcf-mono worker``.

    Test support until the compute plane's agent exists: the inference server is the test echo
    server (whatever image the function names; the gRPC one for ``inferenceUrl: /grpc``), on a free
    port the instance's env is pointed at.
    """

    def __init__(
        self,
        workdir: Path,
        *,
        environ: Mapping[str, str],
        ready_timeout: float = 30.0,
        restart_inference: bool = False,
        worker_addresses: Sequence[str] = (),
        inference: Callable[[Mapping[str, str], int], list[str]] = inference_command,
    ) -> None:
        self.workdir = workdir
        #: The inference server's command line for an instance's environment and port.
        self.inference = inference
        #: WorkerService addresses the instances' workers dial in turn (several invocation nodes); by
        #: default the one the creation message names.
        self.worker_addresses = tuple(worker_addresses)
        self._launches = 0
        self.environ = dict(environ)
        self.ready_timeout = ready_timeout
        #: Start an instance's inference server again when it exits, as a real agent (a pod) does.
        self.restart_inference = restart_inference
        self.running: dict[str, Launched] = {}

    async def start(self, msg: CreationMessage) -> Launched:
        port, health_port = spare_port(), spare_port()
        spec_env = msg.launch_specification.environment
        env = {**self.environ, **spec_env}
        same = spec_env.get("INFERENCE_HEALTH_PORT") == spec_env.get("INFERENCE_PORT")
        env.update(
            {
                "INFERENCE_PORT": str(port),
                "INFERENCE_HEALTH_PORT": str(port if same else spec_env.get("INFERENCE_HEALTH_PORT", port)),
                "HEALTH_PORT": str(health_port),
                "INSTANCE_ID": f"0-sr-{msg.request_id}",
                "WORKER_HEALTH_INTERVAL": "0.2",
                "BASE_ASSET_DIR": str(self.workdir / "assets"),
                "BASE_RESPONSE_DIR": str(self.workdir / "responses"),
            }
        )
        if self.worker_addresses:
            env[NVCF_FQDN_GRPC] = self.worker_addresses[self._launches % len(self.worker_addresses)]
        self._launches += 1
        log = self.workdir / f"{msg.request_id}.log"
        self.workdir.mkdir(parents=True, exist_ok=True)
        out = log.open("ab")
        inference_env = {k: v for k, v in env.items() if k != "NVCF_WORKER_TOKEN"}
        inference = await anyio.open_process(
            self.inference(spec_env, port),
            env=inference_env,
            stdout=out,
            stderr=out,
        )
        worker = await anyio.open_process(
            [sys.executable, "-m", "nvcf_mono", "worker"], env=env, stdout=out, stderr=out
        )
        out.close()
        launched = Launched(
            inference=inference,
            worker=worker,
            health_port=health_port,
            inference_port=port,
            log=log,
            inference_argv=list(self.inference(spec_env, port)),
            inference_env=inference_env,
        )
        self.running[msg.request_id] = launched
        return launched

    async def wait_ready(self, launched: Launched) -> None:
        """Until the worker says ready (connected, inference healthy); raises with the log tail."""
        url = f"http://127.0.0.1:{launched.health_port}/v1/health/ready"
        deadline = anyio.current_time() + self.ready_timeout
        async with aiohttp.ClientSession() as session:
            while anyio.current_time() < deadline:
                if launched.worker.returncode is not None:
                    break
                try:
                    async with session.get(url, timeout=aiohttp.ClientTimeout(total=1)) as resp:
                        if resp.status == 200:
                            return
                except (aiohttp.ClientError, TimeoutError):
                    pass
                await anyio.sleep(0.05)
        raise RuntimeError(f"instance did not become ready: {launched.log.read_text()[-2000:]}")

    async def keep_inference(self, request_id: str) -> None:
        """Start the instance's inference server again whenever it exits, until the instance stops."""
        while True:
            launched = self.running.get(request_id)
            if launched is None:
                return
            await launched.inference.wait()
            if self.running.get(request_id) is not launched:
                return  # stopped on purpose
            code = launched.inference.returncode
            log.info("instance %s: the inference server exited (%s); starting it again", request_id, code)
            with launched.log.open("ab") as out:
                launched.inference = await anyio.open_process(
                    launched.inference_argv, env=launched.inference_env, stdout=out, stderr=out
                )
            launched.restarts += 1
            if self.running.get(request_id) is not launched:  # stopped while it started
                launched.inference.kill()
                await launched.inference.wait()
                return

    async def stop(self, request_id: str) -> None:
        launched = self.running.pop(request_id, None)
        if launched is None:
            return
        with anyio.move_on_after(10, shield=True):
            for proc in (launched.worker, launched.inference):
                if proc.returncode is None:
                    proc.terminate()
            for proc in (launched.worker, launched.inference):
                with anyio.move_on_after(5):
                    await proc.wait()
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()

    async def stop_all(self) -> None:
        for request_id in list(self.running):
            await self.stop(request_id)
