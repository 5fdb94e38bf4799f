"""Task placement and monitors: runs with the reconciler's lease.

QUEUED tasks go to the first matching cluster with room (``Create.NVCA.Task.<cluster>.<gpu>.<type>``,
one instance, the task contract in its environment). The monitors of reference §3.3: a task
still QUEUED after ``maxQueuedDuration`` is EXCEEDED_MAX_QUEUED_DURATION; a placed task whose
worker never connects, or that stays LAUNCHED without a heartbeat, is ERRORED after
``tasks.launch_timeout``; a RUNNING task not heard from for ``tasks.heartbeat_timeout`` is ERRORED.
A terminal task's instance is stopped, and finished tasks are purged after ``tasks.retention``.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime
from typing import final

import anyio

from nvcf_mono.auth.tokens import mint_worker_token
from nvcf_mono.bus.errors import BusError
from nvcf_mono.bus.mirror import Unchanged
from nvcf_mono.contracts import buckets, env, subjects
from nvcf_mono.contracts.messages import (
    Action,
    CreationMessage,
    LaunchSpecification,
    TaskDetails,
    TerminationMessage,
    encode,
)
from nvcf_mono.metrics import Metrics
from nvcf_mono.models.cluster import Cluster, InstanceType, parse_instance_type
from nvcf_mono.models.common import duration_seconds, new_id, now_iso, parse_iso, utc_now
from nvcf_mono.models.deployment import GpuSpec
from nvcf_mono.models.task import TERMINAL, Task, TaskGpuSpecification, TaskHealthInfo, TaskStatus
from nvcf_mono.planes.control.catalog import HELM_CAPABILITY, Capacity, candidates, placeable, visible_clusters
from nvcf_mono.planes.control.context import Control
from nvcf_mono.planes.control.registry import all_pull_credentials, chart_credentials_for, pull_credentials_for
from nvcf_mono.planes.control.tasks.lifecycle import transition
from nvcf_mono.planes.control.telemetry import exports_of, task_environment, worker_exports
from nvcf_mono.structure import evolve, structure


def _since(stamp: str | None, now: datetime) -> float:
    return 0.0 if stamp is None else (now - parse_iso(stamp)).total_seconds()


def task_spec(task: Task) -> GpuSpec:
    """The task's gpuSpecification as a deployment spec, for the placement catalog."""
    return spec_of(task.gpu_specification)


def spec_of(g: TaskGpuSpecification) -> GpuSpec:
    """A task's gpuSpecification as a one-instance deployment spec (what the catalog checks and places)."""
    raw: dict[str, object] = {"gpu": g.gpu, "instanceType": g.instance_type, "minInstances": 0, "maxInstances": 1}
    if g.backend:
        raw["backend"] = g.backend
    if g.clusters:
        raw["clusters"] = list(g.clusters)
    return structure(GpuSpec, raw)


@final
class TaskScheduler:
    """Places and watches tasks while its process holds the lease."""

    def __init__(self, ctl: Control, metrics: Metrics, log: logging.Logger) -> None:
        self._ctl = ctl
        self._log = log
        self._placed = metrics.counter("nvcf_tasks_placed_total", "Task instances requested.")
        self._ended = metrics.counter(
            "nvcf_tasks_ended_total", "Tasks that reached a terminal status, by status.", ["status"]
        )

    async def lead(self) -> None:
        signal = self._ctl.wake
        interval = self._ctl.config.tasks.monitor_interval
        while True:
            seen = signal.version
            try:
                await self.round()
            except BusError as err:
                self._log.warning("task round failed: %s", err)
            with anyio.move_on_after(interval):
                await signal.wait(after=seen)
            await anyio.sleep(0.01)

    async def round(self) -> None:
        store = self._ctl.store
        now = utc_now()
        tasks = sorted(store.tasks.values(), key=lambda t: (t.created_at, t.id))
        if not tasks:
            return  # a round per control-plane change: nothing to do costs nothing, whatever else is deployed
        clusters = {c.cluster_id: c for c in store.clusters.values()}
        capacity = Capacity.from_ledgers(store.placements.values())
        capacity.take_tasks(tasks, clusters)
        for task in tasks:
            await self._watch(task, now, clusters, capacity)

    async def _watch(self, task: Task, now: datetime, clusters: dict[str, Cluster], capacity: Capacity) -> None:
        cfg = self._ctl.config.tasks
        if task.status in TERMINAL:
            if task.request_id and not task.terminating and not task.instance_gone:
                await stop_instance(self._ctl, task, f"task {task.status.value}")
            elif _since(task.finished_at, now) > cfg.retention:
                await purge_task(self._ctl, task)
            return
        if task.status is TaskStatus.QUEUED:
            waited = _since(task.created_at, now)
            if waited > duration_seconds(task.max_queued_duration):
                await self._end(
                    task,
                    TaskStatus.EXCEEDED_MAX_QUEUED_DURATION,
                    f"not started within maxQueuedDuration {task.max_queued_duration}",
                )
            elif task.request_id is None:
                await self._place(task, clusters, capacity)
            elif _since(task.placed_at, now) > cfg.launch_timeout:
                await self._end(
                    task, TaskStatus.ERRORED, f"the task's worker did not connect within {cfg.launch_timeout:g}s"
                )
        elif task.status is TaskStatus.LAUNCHED:
            if _since(task.launched_at, now) > cfg.launch_timeout:
                await self._end(task, TaskStatus.ERRORED, f"no heartbeat within {cfg.launch_timeout:g}s of launch")
        elif task.status is TaskStatus.RUNNING:
            silent = _since(task.last_heartbeat_at or task.running_at, now)
            if silent > cfg.heartbeat_timeout:
                await self._end(task, TaskStatus.ERRORED, f"no heartbeat for {silent:.0f}s")

    async def _end(self, task: Task, status: TaskStatus, error: str) -> None:
        ended = await transition(self._ctl, task.id, status, error=error, expected={task.status})
        if ended is not None:
            self._ended.inc(status=status.value)
            self._log.info("task %s: %s (%s)", task.id, status.value, error)

    async def _place(self, task: Task, clusters: dict[str, Cluster], capacity: Capacity) -> None:
        ctl = self._ctl
        ttl = ctl.config.cluster_heartbeat_ttl
        gpu = task.gpu_specification.gpu
        sites = candidates(visible_clusters(clusters.values(), task.nca_id), task_spec(task))
        if task.helm_chart is not None:
            sites = [(c, it) for c, it in sites if HELM_CAPABILITY in c.capabilities]
        site = next(
            (
                (c, it)
                for c, it in sites
                if placeable(c, ctl.store.health.get(c.cluster_id), ttl) and capacity.fits(c, gpu, it)
            ),
            None,
        )
        if site is None:
            why = (
                "no registered cluster matches the task's gpuSpecification"
                if not sites
                else "waiting for capacity: no matching cluster has room now"
            )
            await self._note_waiting(task, why)
            return
        cluster, it = site
        request_id = new_id()
        message = self._creation(task, cluster, it, request_id)
        subject = subjects.create_subject("Task", cluster.cluster_id, gpu, it.name)
        await ctl.bus.stream(subjects.CREATE_STREAM).publish(subject, encode(message), msg_id=request_id)
        stamp = now_iso()

        def placed(current: Task | None) -> Task:
            if current is None or current.request_id is not None or current.status is not TaskStatus.QUEUED:
                raise Unchanged  # the agent's ack is refused for a request the task does not name
            return evolve(
                current, request_id=request_id, cluster_id=cluster.cluster_id, placed_at=stamp, health_info=None
            )

        await ctl.store.tasks.mutate(task.id, placed)
        capacity.take(cluster.cluster_id, gpu, it.name, it.gpu_count)
        self._placed.inc()
        self._log.info("task %s: placed on cluster %s (%s)", task.id, cluster.cluster_name, it.name)

    async def _note_waiting(self, task: Task, why: str) -> None:
        spec = task.gpu_specification
        info = TaskHealthInfo(gpu=spec.gpu, backend=spec.backend, instance_type=spec.instance_type, error=why)
        if task.health_info == info:
            return

        def note(current: Task | None) -> Task:
            if current is None or current.status is not TaskStatus.QUEUED or current.health_info == info:
                raise Unchanged
            return evolve(current, health_info=info)

        await self._ctl.store.tasks.mutate(task.id, note)

    def _creation(self, task: Task, cluster: Cluster, it: InstanceType, request_id: str) -> CreationMessage:
        ctl = self._ctl
        token = mint_worker_token(
            ctl.tokens,
            nca_id=task.nca_id,
            function_id="",
            function_version_id="",
            request_id=request_id,
            task_id=task.id,
        )
        parsed = parse_instance_type(it.name)
        account_secrets = ctl.store.secrets.get(buckets.account_secrets_key(task.nca_id)) is not None
        environment = {
            env.NVCF_WORKER_TOKEN: token,
            **ctl.worker_link,
            env.NCA_ID: task.nca_id,
            env.NVCT_TASK_ID: task.id,
            env.NVCT_TASK_NAME: task.name,
            env.NVCT_NCA_ID: task.nca_id,
            env.NVCT_HEARTBEAT_INTERVAL: f"{ctl.config.tasks.heartbeat_interval:g}",
            env.NVCT_RESULT_HANDLING: task.result_handling_strategy.value,
            env.FUNCTION_SECRETS_PRESENT: "true" if task.secrets or account_secrets else "false",
            env.ICMS_REQUEST_ID: request_id,
            env.GPU_NAME: task.gpu_specification.gpu,
            env.INSTANCE_TYPE: it.name,
            env.BACKEND: cluster.cluster_group_name,
            env.REGION: cluster.region,
        }
        telemetry = exports_of(ctl.store, ctl.keyring, task.nca_id, task.telemetries, ctl.config.telemetry_networks)
        if telemetry:
            environment[env.NVCF_TELEMETRY_EXPORTS] = worker_exports(telemetry)
        if task.container_image is not None:
            environment[env.INFERENCE_CONTAINER] = task.container_image
            environment[env.INFERENCE_CONTAINER_ARGS] = task.container_args or ""
            # The OpenTelemetry SDK's variables first: one the task sets itself wins.
            environment[env.INFERENCE_CONTAINER_ENV] = json.dumps(
                task_environment(task, telemetry)
                + [{"key": kv.key, "value": kv.value} for kv in task.container_environment or ()]
            )
        pulls = (
            pull_credentials_for(ctl.store, ctl.keyring, task.nca_id, task.container_image)
            if task.helm_chart is None
            else all_pull_credentials(ctl.store, ctl.keyring, task.nca_id)
        )
        if pulls is not None:
            environment[env.CONTAINER_REGISTRIES_CREDENTIALS] = pulls
        charts = chart_credentials_for(ctl.store, ctl.keyring, task.nca_id, task.helm_chart)
        if charts is not None:
            environment[env.HELM_REGISTRIES_CREDENTIALS] = charts
        return CreationMessage(
            request_id=request_id,
            nca_id=task.nca_id,
            action=Action.REQUEST_INSTANCES_FOR_TASK,
            cluster_id=cluster.cluster_id,
            instance_count=1,
            instance_type_name=it.name,
            instance_type_value=parsed.value if parsed is not None else it.name,
            gpu_type=task.gpu_specification.gpu,
            requested_gpu_count=it.gpu_count,
            message_batch_id=request_id,
            created_at=now_iso(),
            task_details=TaskDetails(task_id=task.id, task_name=task.name),
            launch_specification=LaunchSpecification(
                gpu_name=task.gpu_specification.gpu,
                cloud_provider=cluster.cloud_provider,
                container_image=task.container_image,
                helm_chart=task.helm_chart,
                configuration=task.gpu_specification.configuration,
                environment=environment,
                max_runtime_duration=task.max_runtime_duration,
                max_queued_duration=task.max_queued_duration,
                termination_grace_period_duration=task.termination_grace_period_duration,
                result_handling_strategy=task.result_handling_strategy.value,
            ),
        )


async def stop_instance(ctl: Control, task: Task, reason: str) -> None:
    """Ask the task's cluster to stop its instance (``Terminate.NVCA.<cluster>``), once."""
    if task.request_id is None or task.cluster_id is None:
        return
    cluster = ctl.store.clusters.get(task.cluster_id)
    ids = tuple(i.instance_id for i in task.instances if i.instance_id)
    stop = TerminationMessage(
        request_id=f"{task.request_id}-terminate",
        nca_id=task.nca_id,
        action=Action.TERMINATE_INSTANCES,
        cluster_id=task.cluster_id,
        created_at=now_iso(),
        instance_ids=ids,
        request_ids=(task.request_id,),
        availability_zone=cluster.cluster_name if cluster is not None else None,
        task_id=task.id,
        reason=reason,
    )
    await ctl.bus.stream(subjects.TERMINATE_STREAM).publish(
        subjects.terminate_subject(task.cluster_id), encode(stop), msg_id=stop.request_id
    )

    def mark(current: Task | None) -> Task:
        if current is None or current.terminating:
            raise Unchanged
        return evolve(current, terminating=True)

    await ctl.store.tasks.mutate(task.id, mark)


async def purge_task(ctl: Control, task: Task) -> None:
    """Remove a task with its events, results (and their content) and secrets."""
    store = ctl.store
    pattern = buckets.task_item_pattern(task.id)
    for key in await store.task_results.kv.keys(pattern):
        found = await store.task_results.get(key)
        if found is not None and found.value.object_name:
            try:
                await ctl.bus.objects(buckets.TASK_RESULT_CONTENT.name).delete(found.value.object_name)
            except BusError:
                pass
        await store.task_results.kv.purge(key)
    for key in await store.task_events.kv.keys(pattern):
        await store.task_events.kv.purge(key)
    await store.secrets.mutate(buckets.task_secrets_key(task.id), lambda _: None)
    await store.tasks.mutate(task.id, lambda _: None)
