"""The Kubernetes backend: a cluster's instances run as pods on a GPU Kubernetes cluster (NVCA's
container workloads; reference compute-plane §2-§4, §6).

Each cluster with ``backend: kubernetes`` gets its own API client. An instance is a Pod in the
cluster's requests namespace (``<i>-sr-<request>``: the user's container plus the ``utils`` worker)
with its own Secret (the worker token and the function's secrets, mounted) and, when the account
stored credentials for the image's registry, its own pull secret. Each request is an ``ICMSRequest``
object that owns them and carries the instances' states. Pods are watched, not polled: the agent's
looks read a watch-fed cache, and a pod's status turns into an observation (``pod_health.py``).
The agent's durable record of requests stays in its KV bucket, as for every backend.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any, final

import anyio
import attrs
from anyio.abc import TaskGroup

from nvcf_mono.contracts import env, states
from nvcf_mono.contracts.agent import AgentInstance, AgentLog, AgentProcess
from nvcf_mono.contracts.messages import CreationMessage
from nvcf_mono.errors import NvcfMonoError
from nvcf_mono.models.cluster import parse_instance_type
from nvcf_mono.models.common import now_iso
from nvcf_mono.planes.compute.backends import BackendContext, LaunchSpec
from nvcf_mono.planes.compute.backends.kubernetes import discovery, manifests, nvlink, pod_health
from nvcf_mono.planes.compute.backends.kubernetes.api import Kube, KubeError, Obj, PodCache, open_client
from nvcf_mono.planes.compute.config import ClusterSettings, ComputeConfig
from nvcf_mono.planes.compute.gpus import Inventory
from nvcf_mono.planes.compute.health import LaunchFailure, Observation

__all__ = ["KubernetesBackend", "KubernetesProvider"]

#: A created pod the watch has not shown yet after this long is missing.
_UNSEEN_GRACE = 30.0


@final
@attrs.define(eq=False)
class KubeInstance:
    """One instance's pod, as the backend tracks it."""

    instance_id: str
    request_id: str
    cluster_id: str
    task: bool
    created_at: float
    failure: LaunchFailure | None = None
    #: The pod showed up in the watch at least once.
    seen: bool = False
    #: Why it failed, with the end of the log that shows it (fetched once, when it fails).
    error_text: str = ""
    reported: str = ""
    #: Extra objects of the instance to delete with it (pull secret, compute domain).
    extras: tuple[tuple[str, str], ...] = ()

    port: int | None = None
    health_port: int | None = None
    processes: tuple[AgentProcess, ...] = ()


@attrs.frozen(kw_only=True)
class _SecretsSource:
    grpc_address: str
    worker_token: str


class Site:
    """One cluster: its API, its pod cache and its settings."""

    def __init__(self, cluster: ClusterSettings, cluster_id: str, kube: Kube, log: logging.Logger) -> None:
        self.cluster = cluster
        self.cluster_id = cluster_id
        self.kube = kube
        self.log = log
        self.pods = PodCache(kube, {manifests.CLUSTER_LABEL: manifests.label_value(cluster_id)})
        self.namespace_ready = False
        self.version: str | None = None

    @property
    def settings(self) -> Any:
        return self.cluster.kubernetes


class KubernetesBackend:
    """Runs instances as pods on the clusters that name ``backend: kubernetes``."""

    name = "kubernetes"
    capabilities: tuple[str, ...] = ("DynamicGPUDiscovery", "UniformInstanceLabels")

    def __init__(self, ctx: BackendContext) -> None:
        self._config: ComputeConfig = ctx.config
        self._log = ctx.log.getChild("kubernetes")
        self._clusters = [c for c in ctx.config.clusters if c.backend == self.name]
        self._ids = dict(ctx.cluster_ids)
        self._sites: dict[str, Site] = {}
        self._held: dict[str, KubeInstance] = {}
        self._stack: AsyncExitStack | None = None
        self._tg: TaskGroup | None = None

    async def __aenter__(self) -> KubernetesBackend:
        async with AsyncExitStack() as stack:
            for cluster in self._clusters:
                cluster_id = self._ids.get(cluster.name, cluster.id or cluster.name)
                try:
                    api = await open_client(cluster.kubernetes)
                except KubeError as err:
                    raise KubernetesConfigError(f"cluster {cluster.name}: {err}") from None
                stack.push_async_callback(_close_client, api)
                site = Site(cluster, cluster_id, Kube(api, cluster.kubernetes, self._log), self._log)
                self._sites[cluster_id] = site
            # The watches run until the backend is left (entered and left by the same task, no scope between).
            tg = anyio.create_task_group()
            await tg.__aenter__()
            try:
                for site in self._sites.values():
                    await tg.start(site.pods.run)
            except BaseException:
                tg.cancel_scope.cancel()
                await tg.__aexit__(None, None, None)
                raise
            self._tg = tg
            self._stack = stack.pop_all()
        return self

    async def __aexit__(self, *exc: object) -> None:
        tg, self._tg = self._tg, None
        if tg is not None:
            tg.cancel_scope.cancel()
            await tg.__aexit__(None, None, None)
        stack, self._stack = self._stack, None
        if stack is not None:
            with anyio.CancelScope(shield=True):
                await stack.aclose()
        self._held.clear()

    def _site(self, cluster_id: str) -> Site:
        site = self._sites.get(cluster_id)
        if site is None:
            raise KeyError(f"cluster {cluster_id} does not run on the kubernetes backend")
        return site

    # ---- the cluster ---------------------------------------------------------------------------

    async def discover(self, cluster_id: str) -> Inventory | None:
        """The GPUs of the cluster's nodes (labelling each GPU node with its instance type)."""
        site = self._site(cluster_id)
        try:
            nodes = await site.kube.nodes()
            site.version = site.version or await site.kube.server_version()
        except KubeError as err:
            self._log.warning("cluster %s: cannot list nodes (%s); no GPUs until it answers", site.cluster.name, err)
            return Inventory(models=(), multi_node=site.settings.multi_node)
        if site.settings.label_nodes:
            for node, value in discovery.instance_type_labels(nodes, site.cluster.cloud_provider).items():
                try:
                    await site.kube.label_node(node, {manifests.INSTANCE_TYPE_LABEL: value})
                except KubeError as err:
                    self._log.warning("cannot label node %s %s=%s: %s", node, manifests.INSTANCE_TYPE_LABEL, value, err)
        found = discovery.inventory(nodes)
        return attrs.evolve(found, multi_node=site.settings.multi_node)

    def kubernetes_version(self, cluster_id: str) -> str | None:
        site = self._sites.get(cluster_id)
        return site.version if site is not None else None

    def refuse(self, message: CreationMessage) -> LaunchFailure | None:
        if message.launch_specification.helm_chart:
            return LaunchFailure(
                cause=states.CREATE_CONTAINER_ERROR,
                detail="Helm functions and tasks are not installed by this version of the kubernetes backend",
            )
        parsed = parse_instance_type(message.instance_type_name)
        if parsed is not None and parsed.nodes > 1:
            return LaunchFailure(
                cause=states.CREATE_CONTAINER_ERROR,
                detail=f"instance type {message.instance_type_name} spans {parsed.nodes} nodes: multi-node "
                "instances run Helm charts, not a single container",
            )
        return None

    # ---- one instance --------------------------------------------------------------------------

    async def start(self, spec: LaunchSpec) -> KubeInstance:
        site = self._site(spec.cluster_id)
        inst = KubeInstance(
            instance_id=spec.instance_id,
            request_id=spec.request_id,
            cluster_id=spec.cluster_id,
            task=manifests.is_task(spec.message),
            created_at=time.time(),
        )
        self._held[inst.instance_id] = inst
        try:
            await self._create(site, spec, inst)
        except _Refused as err:
            inst.failure = err.failure
            self._log.info("instance %s cannot start: %s", inst.instance_id, err.failure.detail)
        return inst

    async def _create(self, site: Site, spec: LaunchSpec, inst: KubeInstance) -> None:
        settings = site.settings
        kube = site.kube
        try:
            if not site.namespace_ready:
                await kube.ensure_namespace()
                site.namespace_ready = True
            request = await kube.create_request(manifests.icms_request(spec, settings))
            owner = manifests.owner_reference(request)
            secrets_json = await self._secrets(spec)
            await kube.create_secret(manifests.instance_secret(spec, settings, owner=owner, secrets_json=secrets_json))
            pulls = list(settings.image_pull_secrets)
            regcred = manifests.pull_secret(spec, settings, owner=owner)
            if regcred is not None:
                await kube.create_secret(regcred)
                pulls.insert(0, regcred["metadata"]["name"])
                inst.extras += (("secret", regcred["metadata"]["name"]),)
            pod = manifests.instance_pod(
                spec,
                settings,
                cluster_group=site.cluster.group or site.cluster.name,
                owner=owner,
                pull_secrets=pulls,
                ready_timeout=self._config.health.start_timeout + 60,
            )
            if nvlink.nvlink_enabled(site.cluster.attributes):
                pod = await self._nvlink(site, spec, pod, inst)
            await kube.create_pod(pod)
        except ValueError as err:
            raise _Refused(states.CREATE_CONTAINER_ERROR, str(err)) from err
        except KubeError as err:
            if err.status == 403:
                raise _Refused(
                    states.CREATE_CONTAINER_ERROR, f"the agent may not create the instance's objects: {err}"
                ) from err
            if err.status in (400, 422):
                raise _Refused(states.CREATE_CONTAINER_ERROR, f"the cluster refused the pod: {err}") from err
            if err.status == 404:
                raise _Refused(
                    states.CREATE_CONTAINER_ERROR,
                    f"{err} (are the CRDs of deploy/crds/ applied to the cluster?)",
                ) from err
            raise _Refused(states.CREATE_CONTAINER_ERROR, f"cannot create the instance's pod: {err}") from err

    async def _nvlink(self, site: Site, spec: LaunchSpec, pod: Obj, inst: KubeInstance) -> Obj:
        """The pod in its request's NVLink partition, with the request's ComputeDomain."""
        group = manifests.request_name(spec.request_id)
        name, template = f"{group}-cd"[:63], f"{group}-cd-channel"[:63]
        domain = nvlink.compute_domain(name, site.kube.namespace, template, nodes=1)
        await site.kube.create_tolerant(
            site.kube.custom.create_namespaced_custom_object,
            "resource.nvidia.com",
            "v1beta1",
            site.kube.namespace,
            "computedomains",
            domain,
        )
        inst.extras += (("computedomain", name),)
        return nvlink.mutate(pod, group, claim_name=nvlink.CLAIM_NAME, claim_template=template)

    async def _secrets(self, spec: LaunchSpec) -> str | None:
        """The function's (or task's) secrets, fetched for the instance's Secret; None when it has none."""
        contract = spec.message.launch_specification.environment
        if contract.get(env.FUNCTION_SECRETS_PRESENT, "false").lower() != "true":
            return None
        from nvcf_mono.worker.agent import fetch_secrets

        source = _SecretsSource(
            grpc_address=contract.get(env.NVCF_FQDN_GRPC, ""), worker_token=contract.get(env.NVCF_WORKER_TOKEN, "")
        )
        try:
            values = await fetch_secrets(source)
        except Exception as err:  # grpclib's errors, OSError, a timeout: all mean "not now"
            raise _Refused(
                states.CREATE_CONTAINER_ERROR, f"cannot fetch the instance's secrets from {source.grpc_address}: {err}"
            ) from err
        return json.dumps(values)

    async def adopt(self, spec: LaunchSpec, recorded: AgentInstance) -> KubeInstance:
        site = self._site(spec.cluster_id)
        with anyio.move_on_after(site.settings.api_timeout):
            await site.pods.synced.wait()
        if site.pods.get(spec.instance_id) is None:
            self._log.info("instance %s: its pod is gone; creating it again", spec.instance_id)
            return await self.start(spec)
        inst = KubeInstance(
            instance_id=spec.instance_id,
            request_id=spec.request_id,
            cluster_id=spec.cluster_id,
            task=manifests.is_task(spec.message),
            created_at=time.time(),
            seen=True,
        )
        self._held[inst.instance_id] = inst
        return inst

    async def observe(self, handle: object) -> Observation:
        inst = _kube(handle)
        if inst.failure is not None:
            return Observation(ready=False, failure=inst.failure)
        site = self._site(inst.cluster_id)
        pod = site.pods.get(inst.instance_id)
        now = time.time()
        if pod is None:
            if inst.seen or (site.pods.synced.is_set() and now - inst.created_at > _UNSEEN_GRACE):
                obs = pod_health.missing(inst.instance_id)
            else:
                return Observation(ready=False, detail="pod created, not seen yet")
        else:
            inst.seen = True
            s = site.settings
            limits = pod_health.Thresholds(
                scheduling=self._scheduling_limit(inst, pod, s.scheduling_timeout),
                image_pull=s.image_pull_timeout,
                init=s.init_timeout,
                restarts=self._config.health.restart_limit,
            )
            obs = pod_health.observe_pod(pod, now=now, limits=limits, task=inst.task)
        if (obs.failure is not None or (obs.completed is not None and not obs.completed.succeeded)) and not (
            inst.error_text
        ):
            inst.error_text = await self._explain(site, inst, pod, obs)
        await self._report_to_request(site, inst, obs)
        return obs

    @staticmethod
    def _scheduling_limit(inst: KubeInstance, pod: Obj, default: float) -> float:
        """Tasks wait to be scheduled up to their maxQueuedDuration (reference compute-plane §3)."""
        if not inst.task:
            return default
        raw = (pod.get("metadata", {}).get("annotations") or {}).get(manifests.MAX_QUEUED_ANNOTATION)
        try:
            return float(raw) if raw else default
        except ValueError:
            return default

    async def _explain(self, site: Site, inst: KubeInstance, pod: Obj | None, obs: Observation) -> str:
        """The failure's detail, the pod's condition messages, and the end of the relevant log."""
        limit = site.settings.error_log_bytes
        parts = [obs.failure.detail if obs.failure is not None else (obs.completed.detail if obs.completed else "")]
        if pod is not None:
            for cond in pod.get("status", {}).get("conditions") or ():
                if cond.get("status") == "False" and cond.get("message"):
                    parts.append(f"{cond.get('type')}: {cond['message']}")
            container = manifests.TASK if inst.task else manifests.INFERENCE
            restarted = obs.failure is not None and obs.failure.cause == states.CONTAINER_RESTART_LOOP
            log = await site.kube.pod_log(inst.instance_id, container, previous=restarted, limit=limit)
            if log:
                parts.append(log)
        return "\n".join(p for p in parts if p)[-limit:]

    async def _report_to_request(self, site: Site, inst: KubeInstance, obs: Observation) -> None:
        """Mirror the instance's state on its ICMSRequest (best effort: the agent's record is the truth)."""
        if obs.failure is not None:
            state = obs.failure.cause
        elif obs.completed is not None:
            state = states.SUCCEEDED if obs.completed.succeeded else states.FAILED
        else:
            state = states.RUNNING if obs.ready else states.STARTING
        if state == inst.reported:
            return
        bad = state in states.BAD_STATES
        status = {
            "requestStatus": "RequestFailed"
            if bad
            else "RequestCompleted"
            if obs.ready
            else "RequestInstancesInProgress",
            "lastStatusUpdated": now_iso(),
            "instances": {
                inst.instance_id: {
                    "id": inst.instance_id,
                    "instanceType": "Pod",
                    "status": state,
                    "lastReportedStatus": state,
                    "lastReportedTimestamp": now_iso(),
                }
            },
        }
        try:
            await site.kube.patch_request_status(manifests.request_name(inst.request_id), status)
            inst.reported = state
        except KubeError as err:
            self._log.debug("cannot update ICMSRequest of %s: %s", inst.instance_id, err)

    async def stop(self, handle: object, grace: float) -> None:
        inst = _kube(handle)
        site = self._site(inst.cluster_id)
        if site.pods.get(inst.instance_id) is None and inst.failure is not None:
            return  # never created
        try:
            await site.kube.delete_pod(inst.instance_id, int(grace))
        except KubeError as err:
            self._log.warning("deleting pod %s failed: %s", inst.instance_id, err)
            return
        # The kubelet stops the containers within the grace; the watch shows the pod gone.
        with anyio.move_on_after(grace + site.settings.api_timeout):
            while site.pods.get(inst.instance_id) is not None:
                await site.pods.changed(1.0)
        if site.pods.get(inst.instance_id) is not None:
            self._log.warning("pod %s outlived its grace; deleting it at once", inst.instance_id)
            try:
                await site.kube.delete_pod(inst.instance_id, 0)
            except KubeError as err:
                self._log.warning("force-deleting pod %s failed: %s", inst.instance_id, err)

    async def release(self, handle: object) -> None:
        inst = _kube(handle)
        self._held.pop(inst.instance_id, None)
        site = self._site(inst.cluster_id)
        kube = site.kube
        try:
            await kube.delete_secret(manifests.secret_name(inst.instance_id))
            for kind, name in inst.extras:
                if kind == "secret":
                    await kube.delete_secret(name)
                elif kind == "computedomain":
                    await kube._delete(
                        kube.custom.delete_namespaced_custom_object,
                        "resource.nvidia.com",
                        "v1beta1",
                        kube.namespace,
                        "computedomains",
                        name,
                    )
            if not any(h.request_id == inst.request_id for h in self._held.values()):
                await kube.delete_request(manifests.request_name(inst.request_id))
        except KubeError as err:
            self._log.warning("cleaning up after instance %s failed: %s", inst.instance_id, err)

    async def logs(self, cluster_id: str, instance: AgentInstance, tail: int) -> tuple[AgentLog, ...]:
        site = self._sites.get(cluster_id)
        if site is None:
            return ()
        out = []
        task = instance.instance_id in self._held and self._held[instance.instance_id].task
        for container, role in (
            (manifests.TASK if task else manifests.INFERENCE, "inference"),
            (manifests.UTILS, "worker"),
        ):
            text = await site.kube.pod_log(instance.instance_id, container, previous=False, limit=tail)
            path = f"pod/{instance.instance_id}/{container}"
            out.append(AgentLog(name=role, path=path, text=text, size=len(text.encode())))
        return tuple(out)

    def error_log(self, handle: object, source: str, limit: int) -> str:
        return _kube(handle).error_text[-limit:] if limit > 0 else ""

    async def sweep(self, cluster_id: str, root: Path, keep: Sequence[AgentInstance]) -> list[str]:
        """Delete this cluster's pods no record holds (the agent died between creating one and recording it)."""
        site = self._sites.get(cluster_id)
        if site is None:
            return []
        with anyio.move_on_after(site.settings.api_timeout):
            await site.pods.synced.wait()
        wanted = {i.instance_id for i in keep}
        strays = sorted(name for name in site.pods.pods if name not in wanted)
        for name in strays:
            self._log.warning("deleting pod %s: no request holds it", name)
            try:
                await site.kube.delete_pod(name, int(site.settings.termination_grace))
                await site.kube.delete_secret(manifests.secret_name(name))
            except KubeError as err:
                self._log.warning("deleting pod %s failed: %s", name, err)
        return strays


class KubernetesConfigError(NvcfMonoError):
    """A cluster's Kubernetes API cannot be configured (no kubeconfig, not in a pod)."""


class _Refused(Exception):
    def __init__(self, cause: str, detail: str) -> None:
        super().__init__(detail)
        self.failure = LaunchFailure(cause=cause, detail=detail)


def _kube(handle: object) -> KubeInstance:
    assert isinstance(handle, KubeInstance), handle
    return handle


async def _close_client(api: Any) -> None:
    with anyio.move_on_after(2, shield=True):
        await api.close()


class KubernetesProvider:
    """``backend: kubernetes``."""

    name = "kubernetes"

    def create(self, ctx: BackendContext) -> KubernetesBackend:
        return KubernetesBackend(ctx)
