"""The Kubernetes backend: a cluster's instances run as pods on a GPU Kubernetes cluster (NVCA's
container workloads; reference compute-plane §2-§4, §6).

Each cluster with ``backend: kubernetes`` gets its own API client. A container instance is a Pod in
the cluster's requests namespace (``<i>-sr-<request>``: the user's container plus the ``utils`` worker)
with its own Secret (the worker token and the function's secrets, mounted) and, when the account
stored credentials for the image's registry, its own pull secret. A Helm instance is a MiniService:
its chart rendered, validated and applied in a namespace of its own beside the worker's pod
(``miniservice.py``, ``helm_health.py``). Each request is an ``ICMSRequest`` object that carries the
instances' states. Pods are watched, not polled: the agent's looks read a watch-fed cache, and a
pod's status turns into an observation (``pod_health.py``). The agent's durable record of requests
stays in its KV bucket, as for every backend.
"""

from __future__ import annotations

import base64
import json
import logging
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any, final

import anyio
import attrs

from nvcf_mono.backoff import Backoff
from nvcf_mono.contracts import env, pull_credentials, states
from nvcf_mono.contracts.agent import AgentInstance, AgentLog, AgentProcess
from nvcf_mono.contracts.messages import CreationMessage
from nvcf_mono.errors import NvcfMonoError
from nvcf_mono.miniservice_extensions import Install
from nvcf_mono.models.cluster import parse_instance_type
from nvcf_mono.models.common import now_iso
from nvcf_mono.planes.compute import workload
from nvcf_mono.planes.compute.backends import BackendContext, ClusterFacts, LaunchSpec
from nvcf_mono.planes.compute.backends.kubernetes import (
    discovery,
    helm_health,
    manifests,
    miniservice,
    nvcf_backend,
    nvlink,
    pod_health,
)
from nvcf_mono.planes.compute.backends.kubernetes.api import MERGE_PATCH, Kube, KubeError, Obj, PodCache, open_client
from nvcf_mono.planes.compute.backends.kubernetes.extensions import ExtensionFailed, Extensions
from nvcf_mono.planes.compute.config import ClusterSettings, ComputeConfig, KubernetesSettings
from nvcf_mono.planes.compute.gpus import Inventory, static_inventory
from nvcf_mono.planes.compute.health import LaunchFailure, Observation
from nvcf_mono.planes.compute.log_shipping import LogShipper, Put, logs_target, resource_of
from nvcf_mono.planes.compute.log_stamps import Mark, StampedLines
from nvcf_mono.reval.engine import RequestError, RevalRequest, Validator, ValidatorSettings
from nvcf_mono.worker.secrets import ContractSource, fetch_secrets

__all__ = ["KubernetesBackend", "KubernetesProvider"]

#: A created pod the watch has not shown yet after this long is missing.
_UNSEEN_GRACE = 30.0
#: Seconds more than the time since the last line sent that a followed log is asked for again from:
#: the node's clock may run apart from the agent's, and lines already sent are skipped by their time.
_CLOCK_MARGIN = 30
#: Chart objects read for terminal conditions (their pods are watched anyway).
_CONTROLLERS = ("deployments", "replicasets", "statefulsets", "jobs", "cronjobs")
MS_RESOURCE = (miniservice.MS_GROUP, miniservice.MS_VERSION, miniservice.MS_PLURAL)
SECRETS = ("", "v1", "secrets")
PODS = ("", "v1", "pods")
COMPUTE_DOMAINS = ("resource.nvidia.com", "v1beta1", "computedomains")


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
    #: Extra objects of the instance to delete with it (pull secret, compute domain): (resource, name).
    extras: tuple[tuple[tuple[str, str, str], str], ...] = ()
    #: A Helm function or task: its MiniService.
    helm: HelmInstall | None = None
    #: The pod's restarts, for the restart window.
    restarts: pod_health.RestartLog = attrs.field(factory=pod_health.RestartLog)
    #: Where its secrets come from, its Secret (namespace, name), and the secrets it holds (None: unknown).
    secrets_source: ContractSource | None = None
    secret_ref: tuple[str, str] | None = None
    secrets_json: str | None = None

    port: int | None = None
    health_port: int | None = None
    processes: tuple[AgentProcess, ...] = ()


@attrs.define(eq=False)
class HelmInstall:
    """A chart installed for one instance, in its own namespace."""

    namespace: str
    name: str
    by_worker_readiness: bool
    #: What MiniService extensions are told about it.
    install: Install
    #: (resource, name, kind) of every chart object applied, in install order.
    applied: list[tuple[tuple[str, str, str], str, str]] = attrs.field(factory=list)
    phase: str = miniservice.INSTALLING
    #: The objects read every few looks: controllers (for terminal conditions) and what extensions judge.
    controllers: list[Obj] = attrs.field(factory=list)
    #: The namespace's warning events, read with them.
    events: list[Obj] = attrs.field(factory=list)
    checked: float = 0.0
    #: Each pod's restarts (by pod name), for the restart window.
    restarts: dict[str, pod_health.RestartLog] = attrs.field(factory=dict)
    #: When each pod's transient failure (FailedMount, ...) was first seen.
    transient: dict[str, float] = attrs.field(factory=dict)
    #: Since when not every object has been ready (None: all ready at the last look).
    pending_since: float | None = None
    #: It was Running once: a failure now is Failed, before it InstallFailed.
    ran: bool = False


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
        #: What the cluster's NVCFBackend object says (None: there is none, or it is not read).
        self.backend: nvcf_backend.BackendSettings | None = None
        self.agent_status: str | None = None

    @property
    def settings(self) -> KubernetesSettings:
        return self.cluster.kubernetes

    @property
    def attributes(self) -> tuple[str, ...]:
        if self.backend is not None and self.backend.attributes is not None:
            return self.backend.attributes
        return self.cluster.attributes


class KubernetesBackend:
    """Runs instances as pods on the clusters that name ``backend: kubernetes``."""

    name = "kubernetes"

    def __init__(self, ctx: BackendContext) -> None:
        self._charts = ctx.charts
        self._extensions = Extensions(ctx.miniservice_extensions, ctx.log.getChild("kubernetes"))
        self._config: ComputeConfig = ctx.config
        self._log = ctx.log.getChild("kubernetes")
        self._clusters = [c for c in ctx.config.clusters if c.backend == self.name]
        self._ids = dict(ctx.cluster_ids)
        self._sites: dict[str, Site] = {}
        self._held: dict[str, KubeInstance] = {}
        self._stack: AsyncExitStack | None = None
        self._shipper: LogShipper | None = None

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
            # The watches run until the backend is left (entered and left by the same task, no scope between);
            # on the same stack as the clients, so that each is let go whatever fails or is cancelled.
            tg = await stack.enter_async_context(anyio.create_task_group())
            stack.callback(tg.cancel_scope.cancel)
            shipper = LogShipper(self._log, self._config.telemetry_proxy)
            await tg.start(shipper.run)
            self._shipper = shipper
            for site in self._sites.values():
                await tg.start(site.pods.run)
                if site.settings.secrets_refresh > 0:
                    tg.start_soon(self._keep_secrets_current, site, name=f"kubernetes:{site.cluster.name}:secrets")
            self._stack = stack.pop_all()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._shipper = None
        stack, self._stack = self._stack, None
        try:
            if stack is not None:
                await stack.aclose()
        finally:
            self._held.clear()

    @property
    def capabilities(self) -> tuple[str, ...]:
        helm = ("HelmMiniService",) if self._charts is not None and self._charts.name is not None else ()
        return ("DynamicGPUDiscovery", "UniformInstanceLabels", *helm)

    def _site(self, cluster_id: str) -> Site:
        site = self._sites.get(cluster_id)
        if site is None:
            raise KeyError(f"cluster {cluster_id} does not run on the kubernetes backend")
        return site

    # ---- the cluster ---------------------------------------------------------------------------

    async def discover(self, cluster_id: str) -> Inventory | None:
        """The GPUs of the cluster's nodes (labelling each GPU node with its instance type), or the static
        inventory its NVCFBackend names.
        """
        site = self._site(cluster_id)
        try:
            site.version = site.version or await site.kube.server_version()
            await self._read_backend(site)
            backend = site.backend
            multi_node = site.settings.multi_node
            if backend is not None:
                multi_node = backend.multi_node if backend.multi_node is not None else multi_node
                if backend.static_gpus is not None:
                    return attrs.evolve(
                        static_inventory(backend.static_gpus or site.cluster.gpus), multi_node=multi_node
                    )
            nodes = await site.kube.nodes()
        except KubeError as err:
            self._log.warning("cluster %s: cannot list nodes (%s); no GPUs until it answers", site.cluster.name, err)
            await self._report_backend(site, healthy=False)
            return Inventory(models=(), multi_node=site.settings.multi_node)
        if site.settings.label_nodes:
            for node, value in discovery.instance_type_labels(nodes, site.cluster.cloud_provider).items():
                try:
                    await site.kube.label_node(node, {manifests.INSTANCE_TYPE_LABEL: value})
                except KubeError as err:
                    self._log.warning("cannot label node %s %s=%s: %s", node, manifests.INSTANCE_TYPE_LABEL, value, err)
        await self._report_backend(site, healthy=True)
        return attrs.evolve(discovery.inventory(nodes), multi_node=multi_node)

    async def _read_backend(self, site: Site) -> None:
        """The cluster's NVCFBackend, when it has one (no CRD, no object: the configuration alone)."""
        settings = site.settings
        if not settings.nvcf_backend:
            return
        try:
            listed = await site.kube.raw("GET", site.kube.path(*nvcf_backend.RESOURCE, settings.nvcf_backend_namespace))
        except KubeError as err:
            if err.status in (403, 404):  # no CRD, or not ours to read: the configuration alone
                self._log.debug("cluster %s: no NVCFBackend to read (%s)", site.cluster.name, err)
                site.backend = None
            else:  # the API is having trouble: what was read last stays
                self._log.warning("cluster %s: cannot read its NVCFBackend: %s", site.cluster.name, err)
            return
        items = [i for i in listed.get("items") or () if isinstance(i, dict)]
        if settings.nvcf_backend_name:
            items = [i for i in items if (i.get("metadata") or {}).get("name") == settings.nvcf_backend_name]
        if len(items) > 1:
            self._log.warning(
                "cluster %s: %d NVCFBackend objects in %s; name one with nvcf_backend_name",
                site.cluster.name, len(items), settings.nvcf_backend_namespace,
            )  # fmt: skip
            items = []
        found = nvcf_backend.settings_of(items[0]) if items else None
        if found != site.backend:
            self._log.info("cluster %s: settings from NVCFBackend: %s", site.cluster.name, found or "none")
        site.backend = found

    async def _report_backend(self, site: Site, *, healthy: bool) -> None:
        """The agent's status in the NVCFBackend it read (best effort)."""
        if site.backend is None:
            return
        state = "Healthy" if healthy else "Unhealthy"
        status = nvcf_backend.agent_status(
            healthy=healthy, kubernetes_version=site.version, now=now_iso(), changed=state != site.agent_status
        )
        try:
            await site.kube.patch_status(
                nvcf_backend.RESOURCE, site.settings.nvcf_backend_namespace, site.backend.name, status
            )
            site.agent_status = state
        except KubeError as err:
            self._log.debug("cannot update NVCFBackend %s: %s", site.backend.name, err)

    def cluster_facts(self, cluster_id: str) -> ClusterFacts:
        site = self._sites.get(cluster_id)
        if site is None:
            return ClusterFacts()
        backend = site.backend
        capabilities = self.capabilities
        if backend is not None and not backend.helm:
            capabilities = tuple(c for c in capabilities if c != "HelmMiniService")
        return ClusterFacts(
            kubernetes_version=site.version,
            attributes=backend.attributes if backend is not None else None,
            capabilities=capabilities,
        )

    def refuse(self, message: CreationMessage) -> LaunchFailure | None:
        if message.launch_specification.helm_chart:
            if self._charts is None or self._charts.name is None:
                return LaunchFailure(
                    cause=states.CREATE_CONTAINER_ERROR,
                    detail="this agent cannot render Helm charts: enable the 'helm' plugin and install helm or "
                    "helm-python-sdk (pip install 'nvcf-mono[helm]')",
                )
            return None
        refused = workload.refusal(message)
        if refused is not None:
            return refused
        parsed = parse_instance_type(message.instance_type_name)
        if parsed is not None and parsed.nodes > 1:
            return LaunchFailure(
                cause=states.CREATE_CONTAINER_ERROR,
                detail=f"instance type {message.instance_type_name} spans {parsed.nodes} nodes: multi-node "
                "instances run Helm charts, not a single container",
            )
        return None

    # ---- one instance --------------------------------------------------------------------------

    def _hold(self, spec: LaunchSpec, *, seen: bool) -> KubeInstance:
        helm = bool(spec.message.launch_specification.helm_chart)
        namespace = miniservice.namespace_of(spec) if helm else self._site(spec.cluster_id).settings.namespace
        inst = KubeInstance(
            instance_id=spec.instance_id,
            request_id=spec.request_id,
            cluster_id=spec.cluster_id,
            task=manifests.is_task(spec.message),
            created_at=time.time(),
            seen=seen,
            secrets_source=ContractSource.of(spec.message.launch_specification.environment),
            secret_ref=(namespace, manifests.secret_name(spec.instance_id)),
        )
        self._held[inst.instance_id] = inst
        return inst

    async def start(self, spec: LaunchSpec) -> KubeInstance:
        return await self._start(spec, adopted=False)

    async def _start(self, spec: LaunchSpec, *, adopted: bool) -> KubeInstance:
        """Create the instance (``adopted``: install a Helm instance again that an agent before installed)."""
        site = self._site(spec.cluster_id)
        inst = self._hold(spec, seen=False)
        try:
            if spec.message.launch_specification.helm_chart:
                await self._install(site, spec, inst)
            else:
                await self._create(site, spec, inst)
            self._ship_output(site, spec, inst, adopted=adopted)
        except _Refused as err:
            inst.failure = err.failure
            self._log.info("instance %s cannot start: %s", inst.instance_id, err.failure.detail)
            if inst.helm is not None:
                await self._phase(site, inst, miniservice.INSTALL_FAILED, [err.failure.detail])
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
            inst.secrets_json = secrets_json or "{}"
            pulls = list(settings.image_pull_secrets)
            regcred = manifests.pull_secret(spec, settings, owner=owner)
            if regcred is not None:
                await kube.create_secret(regcred)
                pulls.insert(0, regcred["metadata"]["name"])
                inst.extras += ((SECRETS, regcred["metadata"]["name"]),)
            pod = manifests.instance_pod(
                spec,
                settings,
                cluster_group=site.cluster.group or site.cluster.name,
                owner=owner,
                pull_secrets=pulls,
                ready_timeout=self._config.health.start_timeout + 60,
                telemetry_proxy=self._config.telemetry_proxy,
            )
            if nvlink.nvlink_enabled(site.attributes):
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
            # The API failing now (5xx, no answer): the control plane replaces the instance and tries again.
            raise _Refused(states.FAILED, f"cannot create the instance's pod: {err}") from err

    async def _nvlink(self, site: Site, spec: LaunchSpec, pod: Obj, inst: KubeInstance) -> Obj:
        """The pod in its request's NVLink partition, with the request's ComputeDomain."""
        group = manifests.request_name(spec.request_id)
        name, template = f"{group}-cd"[:63], f"{group}-cd-channel"[:63]
        domain = nvlink.compute_domain(name, site.kube.namespace, template, nodes=1)
        await site.kube.create_or_apply(domain, COMPUTE_DOMAINS, miniservice.FIELD_MANAGER)
        inst.extras += ((COMPUTE_DOMAINS, name),)
        return nvlink.mutate(pod, group, claim_name=nvlink.CLAIM_NAME, claim_template=template)

    async def _secrets(self, spec: LaunchSpec) -> str | None:
        """The function's (or task's) secrets, fetched for the instance's Secret; None when it has none."""
        contract = spec.message.launch_specification.environment
        if contract.get(env.FUNCTION_SECRETS_PRESENT, "false").lower() != "true":
            return None
        source = ContractSource.of(contract)
        try:
            fetched = await fetch_secrets(source)
        except Exception as err:  # grpclib's errors, OSError, a timeout: all mean "not now"
            raise _Refused(
                states.FAILED, f"cannot fetch the instance's secrets from {source.grpc_address}: {err}"
            ) from err
        return json.dumps(fetched.values, sort_keys=True)

    async def _keep_secrets_current(self, site: Site) -> None:
        """Every ``secrets_refresh``: each instance's secrets fetched again, its Secret updated when they changed
        (rotation, and an account's first secrets). The kubelet replaces the mounted file atomically.
        """
        interval = site.settings.secrets_refresh
        limiter = anyio.CapacityLimiter(8)
        while True:
            await anyio.sleep(interval)
            held = [i for i in self._held.values() if i.cluster_id == site.cluster_id and i.failure is None]
            async with anyio.create_task_group() as tg:
                for inst in held:
                    tg.start_soon(self._refresh_secrets, site, inst, limiter)

    async def _refresh_secrets(self, site: Site, inst: KubeInstance, limiter: anyio.CapacityLimiter) -> None:
        if inst.secrets_source is None or inst.secret_ref is None:
            return
        async with limiter:
            try:
                with anyio.fail_after(site.settings.api_timeout):
                    fetched = await fetch_secrets(inst.secrets_source)
            except Exception as err:  # not now: the next round asks again
                self._log.debug("instance %s: cannot fetch its secrets: %s", inst.instance_id, err)
                return
            if self._shipper is not None:  # the same answer renews what its output is sent with
                self._shipper.renew(inst.instance_id, fetched.telemetry_exports)
            values = json.dumps(fetched.values, sort_keys=True)
            if values == inst.secrets_json:
                return
            namespace, name = inst.secret_ref
            patch = {"data": {manifests.SECRET_FILE_KEY: base64.b64encode(values.encode()).decode()}}
            try:
                await site.kube.raw("PATCH", site.kube.path("", "v1", "secrets", namespace, name), patch,
                                    content_type=MERGE_PATCH)  # fmt: skip
            except KubeError as err:
                self._log.warning(
                    "instance %s: cannot update its Secret %s/%s: %s", inst.instance_id, namespace, name, err
                )
                return
            if inst.secrets_json is not None:
                self._log.info(
                    "instance %s: its secrets changed; Secret %s/%s updated", inst.instance_id, namespace, name
                )
            inst.secrets_json = values

    # ---- Helm: a MiniService ----------------------------------------------------------------------

    async def _install(self, site: Site, spec: LaunchSpec, inst: KubeInstance) -> None:
        """Render and validate the chart, then install it in the request's namespace (reference §5 doInstall)."""
        settings = site.settings
        kube = site.kube
        namespace = miniservice.namespace_of(spec)
        local = attrs.evolve(settings, namespace=namespace)
        try:
            if not site.namespace_ready:
                await kube.ensure_namespace()
                site.namespace_ready = True
            await kube.create_request(manifests.icms_request(spec, settings))
            objects, config = await self._render(spec, namespace, settings.allow_local_charts)
            inst.helm = HelmInstall(
                namespace=namespace,
                name=miniservice.miniservice_name(spec),
                by_worker_readiness=config.by_worker_readiness,
                install=self._extensions.install(spec, namespace, config.feature_flags),
            )
            await kube.create_tolerant(kube.core.create_namespace, miniservice.namespace(spec))
            made = await kube.create_or_apply(
                miniservice.miniservice(spec, config), MS_RESOURCE, miniservice.FIELD_MANAGER
            )
            await kube.patch_status(MS_RESOURCE, None, made["metadata"]["name"], miniservice.installing_status(objects))
            secrets_json = await self._secrets(spec)
            secret = manifests.instance_secret(spec, local, owner=None, secrets_json=secrets_json)
            await kube.create_or_apply(secret, SECRETS, miniservice.FIELD_MANAGER)
            inst.secrets_json = secrets_json or "{}"
            pulls = await self._helm_pull_secrets(site, spec, local)
            worker = miniservice.utils_pod(
                spec,
                local,
                pull_secrets=pulls,
                ready_timeout=self._config.health.start_timeout + 60,
                telemetry_proxy=self._config.telemetry_proxy,
            )
            await kube.create_or_apply(worker, PODS, miniservice.FIELD_MANAGER)
            for obj in miniservice.apply_order(objects):
                admitted = miniservice.mutate(obj, spec, settings, pull_secrets=pulls, attributes=site.attributes)
                mutated = self._extensions.mutate(admitted, inst.helm.install)
                resource = self._extensions.resource_of(mutated)
                await kube.create_or_apply(mutated, resource, miniservice.FIELD_MANAGER)
                inst.helm.applied.append((resource, mutated["metadata"]["name"], str(mutated.get("kind", ""))))
            await self._phase(site, inst, miniservice.INSTALLED)
            self._log.info(
                "instance %s: chart %s installed in %s (%d objects)",
                inst.instance_id,
                spec.message.launch_specification.helm_chart,
                namespace,
                len(objects),
            )
        except KubeError as err:
            raise _Refused(states.FAILED, f"UnexpectedInstallError: {err}") from err
        except (ValueError, ExtensionFailed) as err:
            raise _Refused(states.FAILED, f"UnexpectedInstallError: {err}") from err

    async def _render(self, spec: LaunchSpec, namespace: str, allow_local: bool) -> tuple[list[Obj], Any]:
        """The chart's objects, rendered and validated as the control plane does (the same renderer)."""
        if self._charts is None:
            raise _Refused(states.CREATE_CONTAINER_ERROR, "this agent cannot render Helm charts")
        launch = spec.message.launch_specification
        contract = launch.environment
        auth = pull_credentials.decode(contract.get(env.HELM_REGISTRIES_CREDENTIALS, ""))
        port = contract.get(env.INFERENCE_PORT, "")
        validator = Validator(
            self._charts, ValidatorSettings(allow_local_charts=allow_local, extra_types=self._extensions.chart_types)
        )
        try:
            result = await validator.render(
                RevalRequest(
                    helm_chart=launch.helm_chart,
                    namespace=namespace,
                    helm_chart_service_name=contract.get(env.HELM_CHART_INFERENCE_SERVICE_NAME) or None,
                    helm_chart_service_port=int(port)
                    if port.isdigit() and not manifests.is_task(spec.message)
                    else None,
                    configuration=miniservice.chart_values(spec),
                    helm_registry_auth_config=auth or None,
                )
            )
        except RequestError as err:
            raise _Refused(states.CREATE_CONTAINER_ERROR, f"ReValResultInvalid: {err}") from err
        if not result.valid:
            # Permanent: another attempt renders the same chart with the same values.
            raise _Refused(states.CREATE_CONTAINER_ERROR, "ReValResultInvalid: " + "; ".join(result.validation_errors))
        objects, config = miniservice.split_workload_config([dict(o) for o in result.output or ()])
        return objects, config

    async def _helm_pull_secrets(self, site: Site, spec: LaunchSpec, local: KubernetesSettings) -> list[str]:
        """The account's registry credentials, and the cluster's configured pull secrets copied in."""
        kube = site.kube
        names = []
        regcred = manifests.pull_secret(spec, local, owner=None, every_registry=True)
        if regcred is not None:
            await kube.create_or_apply(regcred, SECRETS, miniservice.FIELD_MANAGER)
            names.append(regcred["metadata"]["name"])
        for name in site.settings.image_pull_secrets:
            try:
                source = await kube.raw("GET", kube.path(*SECRETS, kube.namespace, name))
            except KubeError as err:
                self._log.warning("pull secret %s/%s cannot be copied: %s", kube.namespace, name, err)
                continue
            copy = {
                "apiVersion": "v1",
                "kind": "Secret",
                "type": source.get("type", "kubernetes.io/dockerconfigjson"),
                "metadata": {"name": name, "namespace": local.namespace},
                "data": source.get("data") or {},
            }
            await kube.create_or_apply(copy, SECRETS, miniservice.FIELD_MANAGER)
            names.append(name)
        return names

    async def _phase(self, site: Site, inst: KubeInstance, phase: str, conditions: Sequence[str] = ()) -> None:
        helm = inst.helm
        if phase == miniservice.FAILED and helm is not None and not helm.ran:
            phase = miniservice.INSTALL_FAILED  # terminal before Running
        if helm is None or (helm.phase == phase and not conditions):
            return
        helm.phase = phase
        status: Obj = {"phase": phase, "lastPhaseTransitionTime": now_iso()}
        if conditions:
            status["conditions"] = [
                {
                    "type": "ObjectsHealthy",
                    "status": "False",
                    "reason": "ObjectStatusErrors",
                    "message": "; ".join(conditions)[:2000],
                }
            ]
        try:
            await site.kube.patch_status(MS_RESOURCE, None, helm.name, status)
        except KubeError as err:
            self._log.debug("cannot update MiniService %s: %s", helm.name, err)

    async def _observe_helm(self, site: Site, inst: KubeInstance, helm: HelmInstall, now: float) -> Observation:
        pods = site.pods.in_namespace(helm.namespace)
        worker = site.pods.get(inst.instance_id, helm.namespace)
        inst.seen = inst.seen or worker is not None
        # Controllers (Deployments, Jobs, ...) and events are read every few looks, not watched.
        if now - helm.checked >= max(self._config.health.probe_interval * 5, 1.0):
            helm.checked = now
            await self._read_objects(site, helm)
        chart_pods = [p for p in pods if p.get("metadata", {}).get("name") != inst.instance_id]
        names = {p.get("metadata", {}).get("name", "") for p in pods}
        helm.restarts = {name: helm.restarts.get(name) or pod_health.RestartLog() for name in names}
        unready = {p["metadata"]["name"] for p in chart_pods if not pod_health.is_ready(p)}
        events = helm_health.event_verdicts(
            helm.events, unready, now, site.settings.failing_object_backoff, helm.transient
        )
        pending = None if helm.pending_since is None else (now - helm.pending_since, site.settings.pending_timeout)
        view = helm_health.observe_helm(
            worker=worker,
            worker_seen=inst.seen,
            worker_name=inst.instance_id,
            pods=chart_pods,
            controllers=[c for c in helm.controllers if c.get("kind") in helm_health.CONDITION_KINDS],
            verdicts=(events, self._extensions.verdicts([*chart_pods, *helm.controllers], helm.install)),
            by_worker_readiness=helm.by_worker_readiness,
            task=inst.task,
            now=now,
            limits=self._limits(site, scheduling=site.settings.scheduling_timeout),
            restarts=helm.restarts,
            pending=pending,
        )
        if view.phase in (miniservice.RUNNING, miniservice.COMPLETED):
            helm.pending_since, helm.ran = None, True
        elif helm.pending_since is None:
            helm.pending_since = now
        await self._phase(site, inst, view.phase, view.objects if view.phase != helm.phase else ())
        obs = view.observation
        if helm.by_worker_readiness and view.objects and obs.failure is None and obs.completed is None:
            # The other objects do not decide; what they do is still shown.
            obs = attrs.evolve(obs, detail="; ".join(filter(None, [obs.detail, *view.objects])))
        return obs

    async def _read_objects(self, site: Site, helm: HelmInstall) -> None:
        """The install's controllers and the objects extensions judge, and its namespace's warning events."""
        found = []
        for resource, name, kind in helm.applied:
            if resource[2] in _CONTROLLERS or kind in self._extensions.health_kinds:
                try:
                    obj = await site.kube.get_object(resource, helm.namespace, name)
                except KubeError:
                    obj = None
                if obj is not None:
                    found.append(obj)
        helm.controllers = found
        helm.events = await self._warnings(site, helm.namespace)

    async def _warnings(self, site: Site, namespace: str) -> list[Obj]:
        """The namespace's warning events (none when the API does not answer: the next look asks again)."""
        try:
            found = await site.kube.raw("GET", site.kube.path("", "v1", "events", namespace))
        except KubeError as err:
            self._log.debug("cannot list the events of %s: %s", namespace, err)
            return []
        return [e for e in found.get("items") or () if isinstance(e, dict) and e.get("type") == "Warning"]

    async def _uninstall(self, site: Site, inst: KubeInstance, helm: HelmInstall, grace: float) -> None:
        """Workload objects first (their pods get the grace), then the worker, then the namespace."""
        kube = site.kube
        for resource, name, _ in reversed(helm.applied):
            try:
                await kube.delete_object(resource, helm.namespace, name)
            except KubeError as err:
                self._log.warning("deleting %s %s/%s failed: %s", resource[2], helm.namespace, name, err)
        with anyio.move_on_after(grace + site.settings.api_timeout):
            while any(
                p.get("metadata", {}).get("name") != inst.instance_id for p in site.pods.in_namespace(helm.namespace)
            ):
                await site.pods.changed(1.0)
        try:
            await kube.delete_pod(inst.instance_id, int(grace), helm.namespace)
        except KubeError as err:
            self._log.warning("deleting the worker pod of %s failed: %s", inst.instance_id, err)

    async def adopt(self, spec: LaunchSpec, recorded: AgentInstance) -> KubeInstance:
        site = self._site(spec.cluster_id)
        with anyio.move_on_after(site.settings.api_timeout):
            await site.pods.synced.wait()
        if spec.message.launch_specification.helm_chart:
            # Installing again is idempotent (create, or server-side apply): what changed is re-applied.
            return await self._start(spec, adopted=True)
        if site.pods.get(spec.instance_id) is None:
            self._log.info("instance %s: its pod is gone; creating it again", spec.instance_id)
            return await self.start(spec)
        inst = self._hold(spec, seen=True)
        self._ship_output(site, spec, inst, adopted=True)
        return inst

    def _ship_output(self, site: Site, spec: LaunchSpec, inst: KubeInstance, *, adopted: bool) -> None:
        """Send what the function's (or task's) containers write to its logs endpoint, when it chose one: its
        one container, or every container of a Helm chart's pods (each line marked with its pod and container).

        An adopted instance's logs are sent from now on: the agent before may have sent the rest.
        """
        contract = spec.message.launch_specification.environment
        target = logs_target(contract)
        if target is None or self._shipper is None:
            return
        now = time.time_ns()
        mark: Mark | None = (now // 1_000_000_000, now % 1_000_000_000, 0) if adopted else None
        name = inst.instance_id

        async def one_container(put: Put) -> None:
            container = manifests.TASK if inst.task else manifests.INFERENCE
            async for line in self._pod_lines(site, name, name, container, namespace=None, mark=mark):
                await put(line, ())

        async def charts_pods(put: Put) -> None:
            assert inst.helm is not None
            await self._chart_lines(site, name, inst.helm.namespace, mark, put)

        produce = charts_pods if inst.helm is not None else one_container
        # Its credentials are renewed by _refresh_secrets, which asks for the instance's secrets anyway.
        self._shipper.follow(name, produce, target, resource_of(contract, name))

    async def _chart_lines(self, site: Site, name: str, namespace: str, mark: Mark | None, put: Put) -> None:
        """Every container of the chart's pods in ``namespace`` (not the worker's own), followed as each pod
        appears, until the pod goes or the instance is released.
        """
        followed: set[tuple[str, str]] = set()

        async def follow(pod: str, container: str) -> None:
            origin = (("k8s.pod.name", pod), ("k8s.container.name", container))
            try:
                async for line in self._pod_lines(site, name, pod, container, namespace=namespace, mark=mark):
                    await put(line, origin)
            finally:
                followed.discard((pod, container))

        async with anyio.create_task_group() as tg:
            while name in self._held:
                for pod in site.pods.in_namespace(namespace):
                    pod_name = pod.get("metadata", {}).get("name", "")
                    if pod_name == name:
                        continue  # the worker's pod: the platform's, not the function's output
                    for container in pod.get("spec", {}).get("containers") or ():
                        key = (pod_name, str(container.get("name", "")))
                        if key not in followed:
                            followed.add(key)
                            tg.start_soon(follow, *key)
                await site.pods.changed(5.0)
            tg.cancel_scope.cancel()

    async def _pod_lines(
        self, site: Site, name: str, pod: str, container: str, *, namespace: str | None, mark: Mark | None
    ) -> AsyncIterator[str]:
        """A container's log lines while instance ``name`` is held (and, for a chart's pod, while the pod is
        there), across its restarts and broken streams: each time from a little before the last line sent
        (``mark``), skipping what was sent.
        """
        backoff = Backoff(1.0, 30.0)
        while name in self._held and (namespace is None or site.pods.get(pod, namespace) is not None):
            ago = None if mark is None else int(time.time()) - mark[0] + _CLOCK_MARGIN
            read = StampedLines(mark)
            try:
                async for stamped in site.kube.follow_pod_log(pod, container, since_seconds=ago, namespace=namespace):
                    line = read.new(stamped)
                    mark = read.mark
                    if line is not None:
                        backoff.reset()
                        yield line
            except KubeError as err:
                # Not started yet (400), gone (404), or the API is away: asked again while it is held.
                self._log.debug("instance %s: following the log of %s/%s: %s", name, pod, container, err)
            await anyio.sleep(backoff.next())

    async def observe(self, handle: object) -> Observation:
        inst = _kube(handle)
        if inst.failure is not None:
            return Observation(ready=False, failure=inst.failure)
        site = self._site(inst.cluster_id)
        now = time.time()
        if inst.helm is not None:
            obs = await self._observe_helm(site, inst, inst.helm, now)
            if obs.failure is not None and not inst.error_text:
                inst.error_text = obs.failure.detail[-site.settings.error_log_bytes :]
            await self._report_to_request(site, inst, obs, miniservice.AGGREGATE.get(inst.helm.phase, "Unknown"))
            return obs
        pod = site.pods.get(inst.instance_id)
        if pod is None:
            if inst.seen or (site.pods.synced.is_set() and now - inst.created_at > _UNSEEN_GRACE):
                obs = pod_health.missing(inst.instance_id)
            else:
                return Observation(ready=False, detail="pod created, not seen yet")
        else:
            inst.seen = True
            limits = self._limits(site, scheduling=self._scheduling_limit(inst, pod, site.settings.scheduling_timeout))
            obs = pod_health.observe_pod(pod, now=now, limits=limits, task=inst.task, restarts=inst.restarts)
        if (obs.failure is not None or (obs.completed is not None and not obs.completed.succeeded)) and not (
            inst.error_text
        ):
            inst.error_text = await self._explain(site, inst, pod, obs)
        await self._report_to_request(site, inst, obs, pod_health.aggregate_state(pod, obs))
        return obs

    def _limits(self, site: Site, *, scheduling: float) -> pod_health.Thresholds:
        s = site.settings
        return pod_health.Thresholds(
            scheduling=scheduling,
            image_pull=s.image_pull_timeout,
            init=s.init_timeout,
            restarts=self._config.health.restart_limit,
            restart_window=self._config.health.restart_window,
        )

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

    async def _report_to_request(self, site: Site, inst: KubeInstance, obs: Observation, aggregate: str) -> None:
        """Mirror the instance's state on its ICMSRequest (best effort: the agent's record is the truth):
        its aggregate state (Scheduling, Pending, Succeeded, Failed) and the instance state reported.
        """
        if obs.failure is not None:
            state = obs.failure.cause
        elif obs.completed is not None:
            state = states.SUCCEEDED if obs.completed.succeeded else states.FAILED
        else:
            state = states.RUNNING if obs.ready else states.STARTING
        if f"{state}|{aggregate}" == inst.reported:
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
                    "instanceType": "MiniService" if inst.helm is not None else "Pod",
                    "status": aggregate,
                    "lastReportedStatus": state,
                    "lastReportedTimestamp": now_iso(),
                }
            },
        }
        try:
            await site.kube.patch_request_status(manifests.request_name(inst.request_id), status)
            inst.reported = f"{state}|{aggregate}"
        except KubeError as err:
            self._log.debug("cannot update ICMSRequest of %s: %s", inst.instance_id, err)

    async def stop(self, handle: object, grace: float) -> None:
        inst = _kube(handle)
        site = self._site(inst.cluster_id)
        if inst.helm is not None:
            await self._uninstall(site, inst, inst.helm, grace)
            return
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
        if self._shipper is not None:
            self._shipper.forget(inst.instance_id)
        site = self._site(inst.cluster_id)
        kube = site.kube
        try:
            if inst.helm is not None:
                # The namespace takes what is left with it (secrets, the worker); then the MiniService.
                await kube.delete_object(("", "v1", "namespaces"), None, inst.helm.namespace)
                await kube.delete_object(MS_RESOURCE, None, inst.helm.name)
            else:
                await kube.delete_secret(manifests.secret_name(inst.instance_id))
            for resource, name in inst.extras:
                await kube.delete_object(resource, kube.namespace, name)
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
        strays = sorted(name for name in site.pods.pods.get(site.kube.namespace, {}) if name not in wanted)
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
