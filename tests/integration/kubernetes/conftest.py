"""The Kubernetes backend against an emulated Kubernetes API server.

No Kubernetes cluster exists here, so the API server is kmock's stateful emulator (a real HTTP
server keeping objects in memory, with lists and watches), made a little more like a real server:
it gives objects a uid, a creation time and a resource version, and starts pods Pending. Nothing runs
the pods: a test plays the scheduler and the kubelet by writing pod statuses through the API, which
the backend sees through its watch like any status change, and by writing containers' log lines,
which the API serves as the kubelet would (``follow``, ``timestamps``, ``sinceSeconds``). Every
object the backend creates is checked against the Kubernetes OpenAPI schemas (``kubernetes-validate``).
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import re
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import kmock
import kubernetes_validate
import yaml

from nvcf_mono.testing.platform import wait_for

#: The Kubernetes version whose schemas the objects are checked against.
SCHEMA_VERSION = "1.33.0"
NAMESPACE = "nvcf-backend"

_BUILT_IN = (
    "v1/pods",
    "v1/secrets",
    "v1/nodes",
    "v1/events",
    "v1/services",
    "v1/configmaps",
    "v1/persistentvolumeclaims",
    "v1/serviceaccounts",
    "apps/v1/deployments",
    "apps/v1/replicasets",
    "apps/v1/statefulsets",
    "batch/v1/jobs",
    "batch/v1/cronjobs",
    "policy/v1/poddisruptionbudgets",
    "rbac.authorization.k8s.io/v1/roles",
    "rbac.authorization.k8s.io/v1/rolebindings",
)
_CUSTOM = (
    "nvca.nvcf.nvidia.io/v2beta1/icmsrequests",
    "nvca.nvcf.nvidia.io/v1alpha1/miniservices",
    "resource.nvidia.com/v1beta1/computedomains",
    "nvcf.nvidia.io/v1/nvcfbackends",
)
_CLUSTER_SCOPED = ("nodes", "namespaces", "miniservices")


def stamp(seconds_ago: float = 0.0) -> str:
    return (datetime.now(UTC) - timedelta(seconds=seconds_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")


_NAMESPACE_PATH = re.compile(r"^/api/v1/namespaces(?:/(?P<name>[^/]+))?$")
_LOG_PATH = re.compile(r"^/api/v1/namespaces/(?P<namespace>[^/]+)/pods/(?P<name>[^/]+)/log$")


def log_stamp(at_ns: int) -> str:
    """A log line's time as the kubelet writes it (RFC 3339, nanoseconds)."""
    return datetime.fromtimestamp(at_ns // 1_000_000_000, UTC).strftime("%Y-%m-%dT%H:%M:%S") + (
        f".{at_ns % 1_000_000_000:09d}Z"
    )


class ApiServer(kmock.KubernetesEmulator):
    """kmock's emulator with the server-set metadata a real API server adds on create, and Namespace
    objects (kmock reads ``/api/v1/namespaces/...`` as a namespace prefix, so they are served here)."""

    _versions = itertools.count(1)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.namespaces: dict[str, dict[str, Any]] = {}
        #: (pod, container) -> its log lines, each with its container's run (restarts so far) and time (ns);
        #: absent: the container has not started.
        self.logs: dict[tuple[str, str], list[tuple[int, int, str]]] = {}
        #: (pod, container) -> its restarts, and how many times its followed logs were cut short.
        self.restarts: dict[tuple[str, str], int] = {}
        self.log_breaks: dict[tuple[str, str], int] = {}
        #: Each read of a log: its query, and the pod as ``_pod``.
        self.log_requests: list[dict[str, str]] = []

    def _pod_exists(self, namespace: str, name: str) -> bool:
        pods = kmock.resource("v1/pods")
        return any(key == (pods, namespace, name) and not obj.deleted for key, obj in self.objects.items())

    async def _log_call(self, request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse | None:
        m = _LOG_PATH.match(request.path)
        if m is None or request.method.upper() != "GET":
            return None
        key = (m["name"], request.query.get("container", ""))
        self.log_requests.append({**request.query, "_pod": m["name"]})
        if not self._pod_exists(m["namespace"], m["name"]):
            return aiohttp.web.json_response({"kind": "Status", "code": 404, "reason": "NotFound"}, status=404)
        if key not in self.logs:
            waiting = {"kind": "Status", "code": 400, "message": f"container {key[1]!r} is waiting to start"}
            return aiohttp.web.json_response(waiting, status=400)
        since = request.query.get("sinceSeconds")
        cutoff = time.time_ns() - int(since) * 1_000_000_000 if since else None
        truth = ("1", "t", "T", "TRUE", "true", "True")  # what the API server's ParseBool takes
        timestamps, follow = request.query.get("timestamps") in truth, request.query.get("follow") in truth
        run, breaks = self.restarts.get(key, 0), self.log_breaks.get(key, 0)
        resp = aiohttp.web.StreamResponse(headers={"Content-Type": "text/plain"})
        await resp.prepare(request)
        sent = 0
        # The running container's log (a restarted one's new run only), until it restarts or the stream is cut.
        while self.restarts.get(key, 0) == run and self.log_breaks.get(key, 0) == breaks:
            lines = self.logs[key]
            for of_run, at, text in lines[sent:]:
                if of_run == run and (cutoff is None or at >= cutoff):
                    await resp.write(((log_stamp(at) + " " if timestamps else "") + text + "\n").encode())
            sent = len(lines)
            if not follow or not self._pod_exists(m["namespace"], m["name"]):
                break
            await asyncio.sleep(0.05)
        await resp.write_eof()
        return resp

    async def _namespace_call(self, request: aiohttp.web.BaseRequest) -> aiohttp.web.Response | None:
        m = _NAMESPACE_PATH.match(request.path)
        if m is None:
            return None
        name, method = m["name"], request.method.upper()
        if method == "POST" and name is None:
            obj = dict(json.loads(await request.read() or b"{}"))
            key = obj.get("metadata", {}).get("name", "")
            if key in self.namespaces:
                return aiohttp.web.json_response({"kind": "Status", "code": 409, "reason": "AlreadyExists"}, status=409)
            obj.setdefault("metadata", {}).update({"uid": str(uuid.uuid4()), "creationTimestamp": stamp()})
            self.namespaces[key] = obj
            return aiohttp.web.json_response(obj, status=201)
        if method == "GET" and name is None:
            return aiohttp.web.json_response({"kind": "NamespaceList", "items": list(self.namespaces.values())})
        if name not in self.namespaces:
            return aiohttp.web.json_response({"kind": "Status", "code": 404, "reason": "NotFound"}, status=404)
        if method == "DELETE":
            return aiohttp.web.json_response(self.namespaces.pop(name))
        return aiohttp.web.json_response(self.namespaces[name])

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        served = await self._namespace_call(raw_request) or await self._log_call(raw_request)
        return served if served is not None else await super().__call__(raw_request)

    async def _handle(self, request: Any) -> Any:
        if request.action == kmock.action.CREATE and isinstance(request.data, dict):
            meta = request.data.setdefault("metadata", {})
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", stamp())
            meta["resourceVersion"] = str(next(self._versions))
            if request.data.get("kind") == "Pod":
                request.data.setdefault("status", {"phase": "Pending"})
        return await super()._handle(request)


class Cluster:
    """The emulated cluster as a test drives it: nodes, pod statuses, and what the backend created."""

    def __init__(self, server: ApiServer, url: str, kubeconfig: Path) -> None:
        self.server = server
        self.url = url
        self.kubeconfig = kubeconfig

    async def _request(self, method: str, path: str, body: Any = None, content_type: str | None = None) -> Any:
        headers = {"Content-Type": content_type} if content_type else {}
        async with (
            aiohttp.ClientSession() as http,
            http.request(
                method, self.url + path, data=json.dumps(body) if body is not None else None, headers=headers
            ) as resp,
        ):
            text = await resp.text()
            assert resp.status < 300, f"{method} {path}: {resp.status} {text}"
            return json.loads(text) if text else None

    async def add_node(
        self,
        name: str,
        product: str | None,
        gpus: int,
        *,
        ready: bool = True,
        cpu: str = "96",
        memory: str = "1024Gi",
        labels: Mapping[str, str] | None = None,
    ) -> None:
        node_labels = {"kubernetes.io/hostname": name, **(labels or {})}
        if product is not None:
            node_labels |= {
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.product": product,
                "nvidia.com/gpu.memory": "81559",
                "nvidia.com/cuda.driver.major": "555",
                "nvidia.com/cuda.driver.minor": "42",
                "nvidia.com/cuda.driver.rev": "06",
            }
        allocatable = {"cpu": cpu, "memory": memory, "ephemeral-storage": "1000Gi", "pods": "110"}
        if gpus:
            allocatable["nvidia.com/gpu"] = str(gpus)
        await self._request(
            "POST",
            "/api/v1/nodes",
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name, "labels": node_labels},
                "spec": {},
                "status": {
                    "allocatable": allocatable,
                    "capacity": allocatable,
                    "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                    "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux"},
                },
            },
        )

    async def patch_node(self, name: str, patch: Mapping[str, Any]) -> None:
        await self._request("PATCH", f"/api/v1/nodes/{name}", patch, "application/merge-patch+json")

    async def set_pod_status(self, name: str, status: Mapping[str, Any], namespace: str = NAMESPACE) -> None:
        """Play the kubelet: replace a pod's status (through the API, so watches see it)."""
        await self._request(
            "PATCH",
            f"/api/v1/namespaces/{namespace}/pods/{name}/status",
            {"status": dict(status)},
            "application/merge-patch+json",
        )

    async def create_pod(self, pod: Mapping[str, Any]) -> None:
        """Play a controller: create a pod (e.g. from a Deployment's template)."""
        await self._request("POST", f"/api/v1/namespaces/{pod['metadata']['namespace']}/pods", dict(pod))

    async def delete_pod(self, name: str, namespace: str = NAMESPACE) -> None:
        await self._request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}")

    def write_log(self, pod: str, container: str, *lines: str) -> None:
        """Play the container: it writes ``lines`` now."""
        run = self.server.restarts.get((pod, container), 0)
        self.server.logs.setdefault((pod, container), []).extend((run, time.time_ns(), line) for line in lines)

    def restart_container(self, pod: str, container: str) -> None:
        """Play the kubelet restarting a container: the logs being followed end; its log starts again."""
        self.server.restarts[(pod, container)] = self.server.restarts.get((pod, container), 0) + 1

    def cut_log_streams(self, pod: str, container: str) -> None:
        """End the container's followed logs (a connection reset, an API server restart); it runs on."""
        self.server.log_breaks[(pod, container)] = self.server.log_breaks.get((pod, container), 0) + 1

    def objects(self, resource: str, namespace: str | None = NAMESPACE) -> dict[str, dict[str, Any]]:
        """Name -> object of what exists now (``v1/pods``, ``nvca.nvcf.nvidia.io/v2beta1/icmsrequests``)."""
        if resource == "v1/namespaces":
            return {k: dict(v) for k, v in self.server.namespaces.items()}
        wanted = kmock.resource(resource)
        out = {}
        for (res, ns, name), obj in self.server.objects.items():
            if res == wanted and ns == namespace and not obj.deleted:
                out[name] = dict(obj.raw)
        return out

    def created(self, resource: str) -> list[dict[str, Any]]:
        """Every object of ``resource`` ever created (as created), also the deleted ones."""
        wanted = kmock.resource(resource)
        return [
            dict(obj.history[0].raw)
            for (res, _, _), obj in self.server.objects.items()
            if res == wanted and obj.history and obj.history[0] is not None
        ]


def validate(obj: Mapping[str, Any]) -> None:
    """Check a built-in object against the Kubernetes OpenAPI schema (strict: unknown fields fail)."""
    kubernetes_validate.validate(dict(obj), SCHEMA_VERSION, strict=True)


def kubeconfig(path: Path, url: str) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "emulated", "cluster": {"server": url}}],
                "users": [{"name": "agent", "user": {"token": "test"}}],
                "contexts": [{"name": "emulated", "context": {"cluster": "emulated", "user": "agent"}}],
                "current-context": "emulated",
            }
        )
    )
    return path


@asynccontextmanager
async def emulated_cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    """An emulated Kubernetes API server on 127.0.0.1 and a kubeconfig for it (use inside the test body)."""
    async with ApiServer() as server, kmock.Server(server) as http:
        for name in _BUILT_IN + _CUSTOM:
            server.resources[name] = kmock.ResourceInfo(namespaced=not name.endswith(_CLUSTER_SCOPED))
        url = str(http.url).rstrip("/")
        yield Cluster(server, url, kubeconfig(tmp_path / "kubeconfig", url))


async def gpu_nodes(kc: Cluster) -> None:
    await kc.add_node("h100-a", "NVIDIA-H100-80GB-HBM3", 8)
    await kc.add_node("h100-b", "NVIDIA-H100-80GB-HBM3", 8)
    await kc.add_node("l40s-a", "NVIDIA-L40S", 4)
    await kc.add_node("l40s-b", "NVIDIA-L40S", 4, ready=False)
    await kc.add_node("system", None, 0)


async def registered(p: Any, cluster_id: str, want: dict[str, int]) -> dict[str, Any]:
    """The cluster's registration once its GPU capacities are ``want``."""

    async def probe() -> dict[str, Any] | None:
        reply = await p.admin.get(f"/v1/accounts/nvcf-default/clusters/{cluster_id}")
        if reply.status != 200:
            return None
        gpus = {g["name"]: g for g in reply.json.get("gpus", [])}
        return reply.json if {n: g["capacity"] for n, g in gpus.items()} == want else None

    return await wait_for(probe, timeout=15, what=f"registration with {want}")


async def one_pod(kc: Cluster, timeout: float = 20) -> dict[str, Any]:
    async def probe() -> dict[str, Any] | None:
        pods = kc.objects("v1/pods")
        return next(iter(pods.values())) if pods else None

    return await wait_for(probe, timeout=timeout, what="the instance's pod")


def ready_status() -> dict[str, Any]:
    return {
        "phase": "Running",
        "startTime": stamp(5),
        "conditions": [
            {"type": "PodScheduled", "status": "True"},
            {"type": "Initialized", "status": "True"},
            {"type": "Ready", "status": "True"},
        ],
        "containerStatuses": [
            {"name": "inference", "ready": True, "restartCount": 0, "state": {"running": {"startedAt": stamp(4)}}},
            {"name": "utils", "ready": True, "restartCount": 0, "state": {"running": {"startedAt": stamp(4)}}},
        ],
    }


async def ended(p: Any, cluster_id: str, instance_id: str, state: str, timeout: float = 20) -> Any:
    """The instance's view (finished ones included) once the agent holds it in ``state``."""
    from tests.integration.compute.conftest import instances

    async def probe() -> Any:
        views = await instances(p.bus, cluster_id, finished=True)
        hit = [v for v in views if v.instance.instance_id == instance_id and v.instance.state == state]
        return hit[0] if hit else None

    return await wait_for(probe, timeout=timeout, what=f"instance {instance_id} {state}")


async def store_ngc_credential(p: Any, api_key: str) -> None:
    """An NGC registry credential of the default account, for pulling containers."""
    secret = base64.b64encode(f"$oauthtoken:{api_key}".encode()).decode()
    stored = await p.admin.post(
        "/v2/nvcf/registry-credentials",
        {"registryHostname": "nvcr.io", "secret": {"name": "ngc", "value": secret}, "artifactTypes": ["CONTAINER"]},
    )
    assert stored.status == 200, stored.body


def k8s_cluster(name: str, cluster_id: str, kubeconfig_path: Path, **kube: Any) -> dict[str, Any]:
    """A cluster setting on the Kubernetes backend with short health timeouts."""
    return {
        "name": name,
        "id": cluster_id,
        "backend": "kubernetes",
        "kubernetes": {"kubeconfig": str(kubeconfig_path), "api_timeout": "5", **kube},
    }
