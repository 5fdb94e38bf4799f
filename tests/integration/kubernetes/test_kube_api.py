"""The agent's Kubernetes calls against the emulated API server: an answer with an error status is an
error (the client reads no body itself for these calls, so it checks no status either).
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from nvcf_mono.planes.compute.backends.kubernetes.api import Kube, KubeError, open_client
from nvcf_mono.planes.compute.config import KubernetesSettings
from tests.integration.kubernetes.conftest import NAMESPACE, emulated_cluster

POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "p-1", "namespace": NAMESPACE},
    "spec": {"containers": [{"name": "inference", "image": "nvcr.io/acme/echo:1"}]},
}


async def test_error_answers_are_errors_and_the_tolerant_calls_tolerate_them(tmp_path: Path) -> None:
    async with emulated_cluster(tmp_path) as kc:
        settings = KubernetesSettings(kubeconfig=kc.kubeconfig, namespace=NAMESPACE)
        api = await open_client(settings)
        try:
            kube = Kube(api, settings, logging.getLogger("test"))
            # The namespace is read (404: absent), then created.
            await kube.ensure_namespace()
            assert NAMESPACE in kc.objects("v1/namespaces")
            assert await kube.create_pod(POD) is not None
            assert await kube.create_pod(POD) is None  # 409: there already
            with pytest.raises(KubeError) as missing:
                await kube.raw("GET", kube.path("", "v1", "pods", NAMESPACE, "p-2"))
            assert missing.value.status == 404
            assert await kube.get_object(("", "v1", "pods"), NAMESPACE, "p-2") is None
            # A container that has not started has no log: a Status answer, never taken for its text.
            assert await kube.pod_log("p-1", "inference", previous=False, limit=1000) == ""
            with pytest.raises(KubeError) as waiting:
                async for _ in kube.follow_pod_log("p-1", "inference", since_seconds=None):
                    pass
            assert waiting.value.status == 400 and "waiting to start" in str(waiting.value)
            kc.write_log("p-1", "inference", "hello")
            assert await kube.pod_log("p-1", "inference", previous=False, limit=1000) == "hello\n"
        finally:
            await api.close()
