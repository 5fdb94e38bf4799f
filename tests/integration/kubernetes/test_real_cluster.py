"""The Kubernetes backend against a real cluster: only when ``KUBECONFIG`` is set and the marker is asked for
(``-m kubernetes_cluster``; ``make test`` never selects it, so a developer's own cluster is not touched).

How to run it: point ``KUBECONFIG`` at a disposable cluster where you may create namespaces, nodes'
labels and CRDs (kind or k3d is enough; GPUs may be fake, as with the fake GPU operator: a node
labelled ``nvidia.com/gpu.present=true`` and ``nvidia.com/gpu.product=...`` with allocatable
``nvidia.com/gpu``), then::

    KUBECONFIG=~/.kube/kind.yaml .venv/bin/pytest -m kubernetes_cluster tests/integration/kubernetes

It applies ``deploy/crds/``, runs the all-in-one platform with one cluster on the Kubernetes backend in
a namespace of its own, checks discovery registers the cluster's GPUs, deploys a function and checks
the real API server accepted its pod as the backend built it, then undeploys and checks the pod and its
objects are gone; the namespace is deleted at the end. The instance does not become ready there: its
worker would have to reach this machine's platform from inside the cluster.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from nvcf_mono.testing.platform import wait_for
from tests.integration.compute.conftest import compute_platform, create, deploy, function, spec

pytestmark = [
    pytest.mark.kubernetes_cluster,
    pytest.mark.skipif(not os.environ.get("KUBECONFIG"), reason="set KUBECONFIG to a disposable cluster to run"),
]

CRDS = Path(__file__).parents[3] / "deploy" / "crds"


async def _apply_crds(api: client.ApiClient) -> None:
    ext = client.ApiextensionsV1Api(api)
    for path in sorted(CRDS.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc:
                continue
            try:
                await ext.create_custom_resource_definition(doc)
            except ApiException as err:
                if err.status != 409:
                    raise


async def test_the_whole_flow_on_the_cluster_of_kubeconfig(tmp_path: Path) -> None:
    kubeconfig = os.environ["KUBECONFIG"].split(os.pathsep)[0]
    namespace = f"nvcf-mono-e2e-{uuid.uuid4().hex[:8]}"
    cluster_id = str(uuid.uuid4())
    api = await config.new_client_from_config(config_file=kubeconfig, persist_config=False)
    core = client.CoreV1Api(api)
    try:
        await _apply_crds(api)
        nodes = (await core.list_node()).items
        gpu_nodes = [n for n in nodes if (n.metadata.labels or {}).get("nvidia.com/gpu.present") == "true"]
        assert gpu_nodes, "the cluster has no node labelled nvidia.com/gpu.present=true (see this module's doc)"
        settings = {"kubeconfig": kubeconfig, "namespace": namespace}
        clusters = [{"name": "real", "id": cluster_id, "backend": "kubernetes", "kubernetes": settings}]
        async with compute_platform(tmp_path, clusters) as p:

            async def gpus() -> list[dict[str, Any]] | None:
                reply = await p.admin.get(f"/v1/accounts/nvcf-default/clusters/{cluster_id}")
                return reply.json.get("gpus") if reply.status == 200 and reply.json.get("gpus") else None

            registered = await wait_for(gpus, timeout=30, what="the cluster's GPUs registered")
            gpu = registered[0]["name"]
            _, _, d = await create(p.admin, function("real-cluster", containerImage="busybox:1.36"))
            await deploy(p.admin, d, spec(gpu))

            async def pod() -> Any:
                items = (await core.list_namespaced_pod(namespace)).items
                return items[0] if items else None

            created = await wait_for(pod, timeout=60, what="the instance's pod on the cluster")
            assert [c.name for c in created.spec.containers] == ["inference", "utils"]
            assert (await p.admin.delete(d)).status == 200

            async def gone() -> bool:
                return not (await core.list_namespaced_pod(namespace)).items

            await wait_for(gone, timeout=180, what="the pod deleted after undeploying")
    finally:
        try:
            await core.delete_namespace(namespace)
        except ApiException:
            pass
        await api.close()
