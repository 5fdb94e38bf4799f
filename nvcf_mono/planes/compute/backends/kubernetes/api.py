"""One GPU cluster's Kubernetes API: its own client (never the global default), calls with deadlines,
objects as plain dicts, and a watch-fed cache of the agent's pods.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import aiohttp
import anyio
from anyio.abc import TaskStatus
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from nvcf_mono.backoff import Backoff
from nvcf_mono.errors import NvcfMonoError
from nvcf_mono.planes.compute.backends.kubernetes.manifests import ICMS_GROUP, ICMS_PLURAL, ICMS_VERSION
from nvcf_mono.planes.compute.config import KubernetesSettings

Obj = dict[str, Any]
MERGE_PATCH = "application/merge-patch+json"
#: Seconds a followed log may stay silent before it is asked for again (a connection that died unnoticed).
FOLLOW_IDLE = 300.0
#: Bytes of one line of a followed log; a longer one comes in pieces.
FOLLOW_LINE = 256 * 1024


class KubeError(NvcfMonoError):
    """A call to the Kubernetes API failed: ``status`` is its HTTP status (0: no answer)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _message(err: ApiException) -> str:
    return _status_message(err.body, err.reason or str(err))


def _status_message(body: Any, reason: Any) -> str:
    """The ``message`` of the API's Status answer, else the HTTP reason."""
    try:
        status = json.loads(body or "{}")
        return str(status.get("message") or reason)
    except (ValueError, TypeError, AttributeError):
        return str(reason)


async def _refuse_error(resp: Any) -> None:
    """KubeError for an answer with an error status, its body read and the response released.

    The client checks the status only where it reads the body itself; every call here reads it.
    """
    if 200 <= resp.status < 300:
        return
    try:
        body = await resp.read()
    finally:
        resp.release()
    raise KubeError(resp.status, _status_message(body, resp.reason))


async def open_client(settings: KubernetesSettings) -> client.ApiClient:
    """A client for the cluster: its kubeconfig (and context), or the pod's service account."""
    try:
        if settings.kubeconfig is not None:
            return await config.new_client_from_config(
                config_file=str(settings.kubeconfig), context=settings.context, persist_config=False
            )
        conf = client.Configuration()
        config.load_incluster_config(client_configuration=conf)  # type: ignore[no-untyped-call]
        return client.ApiClient(configuration=conf)
    except (config.ConfigException, OSError, KeyError, ValueError) as err:
        where = f"kubeconfig {settings.kubeconfig}" if settings.kubeconfig else "the in-cluster service account"
        raise KubeError(0, f"cannot configure a Kubernetes client from {where}: {err}") from err


class Kube:
    """The calls the backend makes, on one cluster."""

    def __init__(self, api: client.ApiClient, settings: KubernetesSettings, log: logging.Logger) -> None:
        self.api = api
        self.settings = settings
        self.namespace = settings.namespace
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.version_api = client.VersionApi(api)
        self.log = log

    async def _call(self, fn: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any) -> Obj:
        """One call with the API deadline; its JSON body as a dict."""
        try:
            with anyio.fail_after(self.settings.api_timeout):
                resp = await fn(*args, _preload_content=False, **kwargs)
                await _refuse_error(resp)
                try:
                    data = await resp.read()
                finally:
                    resp.release()
        except ApiException as err:
            raise KubeError(int(err.status or 0), _message(err)) from err
        except TimeoutError as err:
            raise KubeError(0, f"the Kubernetes API did not answer within {self.settings.api_timeout:g}s") from err
        except OSError as err:  # aiohttp's connection errors are OSErrors
            raise KubeError(0, f"cannot reach the Kubernetes API: {err}") from err
        if not data:
            return {}
        parsed = json.loads(data)
        return parsed if isinstance(parsed, dict) else {"value": parsed}

    # ---- cluster -------------------------------------------------------------------------------

    async def server_version(self) -> str | None:
        try:
            info = await self._call(self.version_api.get_code)
        except KubeError:
            return None
        return str(info.get("gitVersion")) if info.get("gitVersion") else None

    async def nodes(self) -> list[Obj]:
        return list((await self._call(self.core.list_node)).get("items") or [])

    async def label_node(self, name: str, labels: Mapping[str, str]) -> None:
        await self._call(self.core.patch_node, name, {"metadata": {"labels": dict(labels)}}, _content_type=MERGE_PATCH)

    async def ensure_namespace(self) -> None:
        try:
            await self._call(self.core.read_namespace, self.namespace)
        except KubeError as err:
            if err.status != 404:
                raise
            await self.create_tolerant(
                self.core.create_namespace,
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.namespace}},
            )

    # ---- objects -------------------------------------------------------------------------------

    async def create_tolerant(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> Obj | None:
        """Create; an object that exists already is fine (a retry, an agent restart): None then."""
        try:
            return await self._call(fn, *args)
        except KubeError as err:
            if err.status == 409:
                return None
            raise

    async def create_pod(self, pod: Obj) -> Obj | None:
        return await self.create_tolerant(self.core.create_namespaced_pod, self.namespace, pod)

    async def create_secret(self, secret: Obj) -> Obj | None:
        return await self.create_tolerant(self.core.create_namespaced_secret, self.namespace, secret)

    async def delete_pod(self, name: str, grace: int, namespace: str | None = None) -> None:
        """Delete a pod of the agent's namespace (or of ``namespace``: a Helm instance's)."""
        await self._delete(
            self.core.delete_namespaced_pod, name, namespace or self.namespace, grace_period_seconds=grace
        )

    async def delete_secret(self, name: str) -> None:
        await self._delete(self.core.delete_namespaced_secret, name, self.namespace)

    async def _delete(self, fn: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any) -> None:
        try:
            await self._call(fn, *args, **kwargs)
        except KubeError as err:
            if err.status != 404:
                raise

    async def _open_log(self, name: str, container: str, namespace: str | None = None, **query: Any) -> Any:
        """The answer to a read of a container's log, its body not read yet; KubeError when there is none."""
        try:
            with anyio.fail_after(self.settings.api_timeout):
                resp: Any = await self.core.read_namespaced_pod_log(
                    name, namespace or self.namespace, container=container, _preload_content=False, **query
                )
                await _refuse_error(resp)  # not started, no previous container: a Status, not its log
                return resp
        except ApiException as err:
            raise KubeError(int(err.status or 0), _message(err)) from err
        except (TimeoutError, OSError) as err:
            raise KubeError(0, f"cannot read the log of {name}/{container}: {err}") from err

    async def pod_log(self, name: str, container: str, *, previous: bool, limit: int) -> str:
        """The end of a container's log ('' when there is none)."""
        try:
            resp = await self._open_log(name, container, previous=previous, tail_lines=200)
            try:
                with anyio.fail_after(self.settings.api_timeout):
                    data = await resp.read()
            finally:
                resp.release()
        except (KubeError, TimeoutError, OSError):
            return ""
        return data.decode(errors="replace")[-limit:] if limit > 0 else ""

    async def follow_pod_log(
        self, name: str, container: str, *, since_seconds: int | None, namespace: str | None = None
    ) -> AsyncIterator[str]:
        """A container's log as it is written, each line after its time (RFC 3339, to the nanosecond) and a
        space, from ``since_seconds`` ago (all of it: None), until the container ends or nothing comes for
        :data:`FOLLOW_IDLE` seconds. A line longer than :data:`FOLLOW_LINE` comes in pieces. ``namespace``:
        the pod's (default: the agent's).
        """
        timeout = aiohttp.ClientTimeout(sock_connect=self.settings.api_timeout, sock_read=FOLLOW_IDLE)
        since: dict[str, Any] = {} if since_seconds is None else {"since_seconds": since_seconds}
        query = {"follow": True, "timestamps": True, "_request_timeout": timeout, **since}
        resp = await self._open_log(name, container, namespace, **query)
        try:
            carry = b""
            async for chunk in resp.content.iter_any():
                carry += chunk
                *lines, carry = carry.split(b"\n")
                for line in lines:
                    yield line.decode(errors="replace")
                while len(carry) > FOLLOW_LINE:
                    piece, carry = carry[:FOLLOW_LINE], carry[FOLLOW_LINE:]
                    yield piece.decode(errors="replace")
            if carry:
                yield carry.decode(errors="replace")
        except (TimeoutError, OSError, aiohttp.ClientPayloadError):
            return  # idle, cut off or reset: the caller follows again from the last line it has
        finally:
            resp.release()

    # ---- any object (a chart's) ------------------------------------------------------------------

    @staticmethod
    def path(group: str, version: str, plural: str, namespace: str | None, name: str | None = None) -> str:
        base = f"/api/{version}" if not group else f"/apis/{group}/{version}"
        where = f"/namespaces/{namespace}" if namespace else ""
        return f"{base}{where}/{plural}" + (f"/{name}" if name else "")

    async def raw(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        query: list[tuple[str, Any]] | None = None,
    ) -> Obj:
        """Any call by path (the chart's kinds have no typed API here)."""
        return await self._call(
            self.api.call_api,
            path,
            method,
            query_params=query or [],
            header_params={"Content-Type": content_type, "Accept": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
            _return_http_data_only=True,
        )

    async def create_or_apply(self, obj: Obj, resource: tuple[str, str, str], field_manager: str) -> Obj:
        """Create the object, or bring an existing one to this state by server-side apply."""
        group, version, plural = resource
        meta = obj.get("metadata", {})
        namespace = meta.get("namespace")
        try:
            return await self.raw("POST", self.path(group, version, plural, namespace), obj)
        except KubeError as err:
            if err.status != 409:
                raise
        return await self.raw(
            "PATCH",
            self.path(group, version, plural, namespace, meta["name"]),
            obj,
            content_type="application/apply-patch+yaml",
            query=[("fieldManager", field_manager), ("force", "true")],
        )

    async def get_object(self, resource: tuple[str, str, str], namespace: str | None, name: str) -> Obj | None:
        try:
            return await self.raw("GET", self.path(*resource, namespace, name))
        except KubeError as err:
            if err.status == 404:
                return None
            raise

    async def delete_object(self, resource: tuple[str, str, str], namespace: str | None, name: str) -> None:
        try:
            await self.raw("DELETE", self.path(*resource, namespace, name), {"propagationPolicy": "Background"})
        except KubeError as err:
            if err.status != 404:
                raise

    async def patch_status(self, resource: tuple[str, str, str], namespace: str | None, name: str, status: Obj) -> None:
        await self.raw(
            "PATCH", self.path(*resource, namespace, name) + "/status", {"status": status}, content_type=MERGE_PATCH
        )

    # ---- ICMSRequest ---------------------------------------------------------------------------

    async def create_request(self, body: Obj) -> Obj:
        """Create the ICMSRequest, or read it back when it exists already."""
        name = body["metadata"]["name"]
        created = await self.create_tolerant(
            self.custom.create_namespaced_custom_object, ICMS_GROUP, ICMS_VERSION, self.namespace, ICMS_PLURAL, body
        )
        if created is not None:
            return created
        return await self._call(
            self.custom.get_namespaced_custom_object, ICMS_GROUP, ICMS_VERSION, self.namespace, ICMS_PLURAL, name
        )

    async def patch_request_status(self, name: str, status: Obj) -> None:
        await self._call(
            self.custom.patch_namespaced_custom_object_status,
            ICMS_GROUP,
            ICMS_VERSION,
            self.namespace,
            ICMS_PLURAL,
            name,
            {"status": status},
            _content_type=MERGE_PATCH,
        )

    async def delete_request(self, name: str) -> None:
        await self._delete(
            self.custom.delete_namespaced_custom_object, ICMS_GROUP, ICMS_VERSION, self.namespace, ICMS_PLURAL, name
        )


class PodCache:
    """The agent's pods in every namespace (its own and its Helm instances'), kept current by a list and then
    a watch (relisted on errors), by (namespace, name).
    """

    def __init__(self, kube: Kube, selector: Mapping[str, str]) -> None:
        self._kube = kube
        self._selector = dict(selector)
        #: namespace -> name -> pod (a Helm instance reads its own namespace's at every look).
        self.pods: dict[str, dict[str, Obj]] = {}
        self.synced = anyio.Event()
        #: Set (and replaced) on every change, for whoever waits for one.
        self._changed = anyio.Event()

    def _mine(self, pod: Mapping[str, Any]) -> bool:
        # The selector is also sent to the server; checked again here so a server that ignores it is harmless.
        labels = pod.get("metadata", {}).get("labels") or {}
        return all(labels.get(k) == v for k, v in self._selector.items())

    def get(self, name: str, namespace: str | None = None) -> Obj | None:
        return self.pods.get(namespace or self._kube.namespace, {}).get(name)

    def in_namespace(self, namespace: str) -> list[Obj]:
        return list(self.pods.get(namespace, {}).values())

    async def changed(self, timeout: float) -> None:
        """Wait for the next change (or ``timeout`` seconds)."""
        event = self._changed
        with anyio.move_on_after(timeout):
            await event.wait()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    @staticmethod
    def _key(pod: Mapping[str, Any]) -> tuple[str, str]:
        meta = pod.get("metadata", {})
        return str(meta.get("namespace", "")), str(meta.get("name", ""))

    def apply(self, kind: str, pod: Obj) -> None:
        key = self._key(pod)
        if not key[1] or not self._mine(pod):
            return
        namespace, name = key
        if kind == "DELETED":
            held = self.pods.get(namespace, {})
            held.pop(name, None)
            if not held:
                self.pods.pop(namespace, None)
        elif kind in ("ADDED", "MODIFIED"):
            self.pods.setdefault(namespace, {})[name] = pod
        self._notify()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """List, then watch, forever; ready at once (``synced`` tells when the first list arrived)."""
        task_status.started()
        kube = self._kube
        selector = ",".join(f"{k}={v}" for k, v in self._selector.items())
        backoff = Backoff(0.2, 10.0)
        while True:
            try:
                listing = await kube._call(kube.core.list_pod_for_all_namespaces, label_selector=selector)
                pods: dict[str, dict[str, Obj]] = {}
                for pod in listing.get("items") or []:
                    if self._mine(pod):
                        namespace, name = self._key(pod)
                        pods.setdefault(namespace, {})[name] = pod
                self.pods = pods
                self.synced.set()
                self._notify()
                version = (listing.get("metadata") or {}).get("resourceVersion")
                began = anyio.current_time()
                await self._watch(selector, version)
                if anyio.current_time() - began < 1.0:
                    # A watch that ends at once (a server that does not stream): no tight relist loop.
                    await anyio.sleep(backoff.next())
                else:
                    backoff.reset()
            except KubeError as err:
                pause = backoff.next()
                kube.log.warning("watching the agent's pods failed (%s); again in %.1fs", err, pause)
                await anyio.sleep(pause)

    async def _watch(self, selector: str, version: str | None) -> None:
        kube = self._kube
        timeout = int(kube.settings.watch_timeout)
        # "true", not True: the client would send "True", which some servers do not take for a watch.
        kwargs: dict[str, Any] = {"label_selector": selector, "watch": "true", "timeout_seconds": timeout}
        if version and version.isdigit():
            kwargs["resource_version"] = version
        try:
            with anyio.fail_after(kube.settings.api_timeout):
                resp: Any = await kube.core.list_pod_for_all_namespaces(_preload_content=False, **kwargs)
                await _refuse_error(resp)
        except ApiException as err:
            raise KubeError(int(err.status or 0), _message(err)) from err
        except (TimeoutError, OSError) as err:
            raise KubeError(0, f"cannot start a watch: {err}") from err
        try:
            # The server ends the watch after ``timeout``; a silent, dead connection ends here too.
            with anyio.move_on_after(timeout + kube.settings.api_timeout):
                async for line in resp.content:
                    if not line.strip():
                        continue
                    try:
                        event = json.loads(line)
                    except ValueError:
                        continue
                    kind, obj = event.get("type"), event.get("object") or {}
                    if kind == "ERROR":
                        return  # e.g. 410 Gone: relist
                    if kind == "BOOKMARK":
                        continue
                    self.apply(str(kind), obj)
        except (OSError, anyio.EndOfStream) as err:
            raise KubeError(0, f"the pod watch broke: {err}") from err
        finally:
            resp.release()
