"""Helm functions on the Kubernetes backend: NVIDIA's ``inference-test`` sample shape installed as a
MiniService on the emulated cluster, its health with and without ``StatusByWorkerReadiness``.

The emulated API server runs no controllers: the test plays the Deployment controller (it creates the
pods from the applied Deployment's template) and the kubelet (it writes pod statuses).
"""

from __future__ import annotations

import base64
import copy
import json
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from nvcf_mono.testing.platform import wait_for, wait_status
from tests.function_charts import INFERENCE, SERVICE, SIDECAR, VALUES, WORKLOAD_CONFIG, write_chart
from tests.integration.compute.conftest import compute_platform, create, deploy, instances, running, spec
from tests.integration.compute.test_telemetry_export import LOOPBACK, TOKEN, otlp_receiver, telemetry_endpoint
from tests.integration.kubernetes.conftest import (
    Cluster,
    emulated_cluster,
    ended,
    gpu_nodes,
    k8s_cluster,
    ready_status,
    registered,
    stamp,
    store_ngc_credential,
    validate,
)

CLUSTER = str(uuid.uuid4())
LOCAL = {"plugins.control.helm.allow_local_charts": "true"}


@asynccontextmanager
async def helm_platform(tmp_path: Path, **settings: str) -> AsyncIterator[tuple[Cluster, Any]]:
    """The emulated cluster with GPU nodes, and the platform with an agent on it that installs local charts."""
    async with emulated_cluster(tmp_path) as kc:
        await gpu_nodes(kc)
        clusters = [k8s_cluster("gpu-a", CLUSTER, kc.kubeconfig, allow_local_charts=True)]
        async with compute_platform(tmp_path, clusters, **{**LOCAL, **settings}) as p:
            yield kc, p


def worker_pod(kc: Cluster, namespace: str) -> str:
    """The name of the instance's worker pod in its namespace."""
    pods = [name for (res, ns, name) in kc.server.objects if res.plural == "pods" and ns == namespace]
    return next(name for name in pods if name.startswith("0-sr-"))


def helm_function(chart: Path) -> dict[str, Any]:
    return {
        "name": "inference-test",
        "inferenceUrl": "/v2/models/m/infer",
        "inferencePort": 8001,
        "helmChart": f"file://{chart}",
        "helmChartServiceName": "inference-svc",
    }


async def installed(kc: Cluster, kind: str, name: str) -> tuple[str, dict[str, Any]]:
    """The namespace and object of ``kind``/``name`` once the agent applied it."""

    async def probe() -> tuple[str, dict[str, Any]] | None:
        for (res, ns, obj_name), obj in kc.server.objects.items():
            if res.plural == kind and obj_name == name and not obj.deleted and ns and ns.startswith("sr-"):
                return ns, dict(obj.raw)
        return None

    return await wait_for(probe, timeout=20, what=f"{kind}/{name} installed")


def pod_from(template_owner: dict[str, Any], namespace: str, name: str) -> dict[str, Any]:
    """A pod as the Deployment controller makes it from the (mutated) template."""
    template = copy.deepcopy(template_owner["spec"]["template"])
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {**template.get("metadata", {}), "name": name, "namespace": namespace},
        "spec": template["spec"],
    }


def failed_status() -> dict[str, Any]:
    return {
        "phase": "Failed",
        "reason": "Evicted",
        "message": "The node was low on resource: memory.",
        "startTime": stamp(5),
    }


async def start_sample(
    kc: Cluster, p: Any, chart: Path, configuration: dict[str, Any] | None = None, **fields: Any
) -> tuple[str, str, str]:
    """Create and deploy the function (``fields`` added to it); play the controllers until its pods run.
    (namespace, worker, deployment path)
    """
    await registered(p, CLUSTER, {"H100": 16, "L40S": 4})
    _, _, d = await create(p.admin, {**helm_function(chart), **fields})
    extra = {"configuration": configuration} if configuration else {}
    await deploy(p.admin, d, spec("H100", **extra))
    ns, inference = await installed(kc, "deployments", "inference")
    _, metrics = await installed(kc, "deployments", "metrics")
    await kc.create_pod(pod_from(inference, ns, "inference-abc12"))
    await kc.create_pod(pod_from(metrics, ns, "metrics-def34"))
    worker = worker_pod(kc, ns)
    for name in (worker, "inference-abc12", "metrics-def34"):
        await kc.set_pod_status(name, ready_status(), namespace=ns)
    return ns, worker, d


@pytest.mark.slow
async def test_the_sample_installs_as_a_miniservice_and_only_the_worker_decides_with_the_flag(tmp_path: Path) -> None:
    chart = write_chart(
        tmp_path / "chart",
        templates={"i.yaml": INFERENCE, "s.yaml": SERVICE, "m.yaml": SIDECAR, "w.yaml": WORKLOAD_CONFIG},
    )
    async with helm_platform(tmp_path) as (kc, p):
        await store_ngc_credential(p, "nvapi-KEY-0002")
        ns, worker, d = await start_sample(kc, p, chart, configuration={"greeting": "from-the-deployment"})

        # What the agent installed: the namespace, the MiniService, the worker, the chart's objects.
        namespaces = kc.objects("v1/namespaces", None)
        assert namespaces[ns]["metadata"]["labels"]["nvca.nvcf.nvidia.io/workload-instance-type"] == "miniservice"
        (ms,) = kc.objects("nvca.nvcf.nvidia.io/v1alpha1/miniservices", None).values()
        assert ms["spec"]["namespace"] == ns
        assert ms["spec"]["workloadConfig"] == {"featureFlags": {"StatusByWorkerReadiness": True}}
        assert ms["spec"]["helmChartConfig"]["serviceName"] == "inference-svc"
        assert "nvcf-workload-config" not in kc.objects("v1/configmaps", ns)  # read, never installed
        assert set(kc.objects("v1/services", ns)) == {"inference-svc"}
        pod = kc.objects("v1/pods", ns)[worker]
        utils_env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        assert utils_env["INFERENCE_HOST"] == f"inference-svc.{ns}.svc.cluster.local"
        assert utils_env["INFERENCE_PORT"] == "8001"
        # Values from the deployment reach the rendered objects; pull secrets reach every pod spec.
        deployments = kc.objects("apps/v1/deployments", ns)
        server = deployments["inference"]["spec"]["template"]["spec"]["containers"][0]
        assert {"name": "GREETING", "value": "from-the-deployment"} in server["env"]
        for name, obj in deployments.items():
            pulls = [s["name"] for s in obj["spec"]["template"]["spec"]["imagePullSecrets"]]
            assert pulls == [f"workload-{worker}-regcred-0"], name
            affinity = obj["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
            assert affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0][
                "matchExpressions"
            ][0]["values"] == ["ON-PREM.GPU.H100"]
            validate(obj)
        assert [s["name"] for s in pod["spec"]["imagePullSecrets"]] == [f"workload-{worker}-regcred-0"]
        regcred = kc.objects("v1/secrets", ns)[f"workload-{worker}-regcred-0"]
        config = json.loads(base64.b64decode(regcred["data"][".dockerconfigjson"]))
        assert list(config["auths"]) == ["nvcr.io"]
        validate({**pod, "status": {}})  # the status is the test's own (it plays the kubelet)

        (view,) = await running(p.bus, CLUSTER)
        assert view.instance.instance_id == worker
        await wait_status(p.admin, d, "ACTIVE")

        async def phase(want: str) -> bool:
            (obj,) = kc.objects("nvca.nvcf.nvidia.io/v1alpha1/miniservices", None).values()
            return obj.get("status", {}).get("phase") == want

        await wait_for(lambda: phase("Running"), timeout=10, what="MiniService Running")

        # The metrics sidecar fails: with StatusByWorkerReadiness the instance keeps running.
        await kc.set_pod_status("metrics-def34", failed_status(), namespace=ns)

        async def noted() -> Any:
            (v,) = await instances(p.bus, CLUSTER)
            return v if v.instance.state == "running" else None

        for _ in range(10):  # several looks at the instance, each still running
            await noted()
        (still,) = await instances(p.bus, CLUSTER)
        assert still.instance.state == "running" and still.instance.instance_id == worker


@pytest.mark.slow
async def test_without_the_flag_a_failing_object_fails_the_instance_and_the_install_goes(tmp_path: Path) -> None:
    chart = write_chart(tmp_path / "chart", templates={"i.yaml": INFERENCE, "s.yaml": SERVICE, "m.yaml": SIDECAR})
    async with helm_platform(tmp_path) as (kc, p):
        ns, worker, _ = await start_sample(kc, p, chart)
        await running(p.bus, CLUSTER)
        await kc.set_pod_status("metrics-def34", failed_status(), namespace=ns)

        view = await ended(p, CLUSTER, worker, "failed")
        assert view.instance.status == "instance-terminated-by-service"
        assert "ObjectsFailed" in (view.instance.error_log or "") and "metrics-def34" in (view.instance.error_log or "")

        async def cleaned() -> bool:
            return ns not in kc.objects("v1/namespaces", None) and not kc.objects(
                "nvca.nvcf.nvidia.io/v1alpha1/miniservices", None
            )

        await wait_for(cleaned, timeout=20, what="the namespace and MiniService deleted")
        # The chart's objects went first.
        assert not kc.objects("apps/v1/deployments", ns)


async def test_an_invalid_chart_at_deploy_time_and_on_the_local_backend(tmp_path: Path) -> None:
    chart = write_chart(tmp_path / "chart", templates={"i.yaml": INFERENCE, "s.yaml": SERVICE})
    async with helm_platform(tmp_path) as (_, p):
        await registered(p, CLUSTER, {"H100": 16, "L40S": 4})
        _, _, d = await create(p.admin, helm_function(chart))
        # The deployment's values make the Service a NodePort: refused with the validator's text.
        reply = await p.admin.post(
            d, {"deploymentSpecifications": [spec("H100", configuration={"serviceType": "NodePort"})]}
        )
        assert reply.status == 400, reply.body
        assert reply.json["validationErrors"] == ["service is not ClusterIP"]
        assert VALUES["serviceType"] == "ClusterIP"


TRAIN_JOB = """\
apiVersion: batch/v1
kind: Job
metadata:
  name: train
spec:
  template:
    spec:
      restartPolicy: Never
      containers:
        - name: train
          image: nvcr.io/acme/train:1
          env:
            - {name: TASK_ID, value: {{ .Values.nvctTaskId | quote }}}
            - {name: EPOCHS, value: {{ .Values.epochs | quote }}}
          resources:
            limits: {nvidia.com/gpu: 1}
"""


@pytest.mark.slow
async def test_a_helm_task_gets_the_task_values_and_completes_with_its_job(tmp_path: Path) -> None:
    chart = write_chart(tmp_path / "chart", name="train", templates={"job.yaml": TRAIN_JOB}, values={"epochs": 1})
    async with helm_platform(tmp_path) as (kc, p):
        await registered(p, CLUSTER, {"H100": 16, "L40S": 4})
        made = await p.admin.post(
            "/v1/nvct/tasks",
            {
                "name": "train",
                "helmChart": f"file://{chart}",
                "gpuSpecification": {
                    "gpu": "H100",
                    "instanceType": "ON-PREM.GPU.H100_1x",
                    "configuration": {"epochs": 3},
                },
            },
        )
        assert made.status == 200, made.body
        task_id = made.json["task"]["id"]
        ns, job = await installed(kc, "jobs", "train")
        env = {e["name"]: e["value"] for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert env["TASK_ID"] == task_id and env["EPOCHS"] == "3"  # the task's values, then the user's
        # The Job's pod ran; the Job completed.
        pod = pod_from(job, ns, "train-x1")
        await kc.create_pod(pod)
        await kc.set_pod_status("train-x1", {"phase": "Succeeded", "startTime": stamp(3)}, namespace=ns)
        await kc._request(
            "PATCH",
            f"/apis/batch/v1/namespaces/{ns}/jobs/train/status",
            {"status": {"conditions": [{"type": "Complete", "status": "True"}], "succeeded": 1}},
            "application/merge-patch+json",
        )

        async def finished() -> Any:
            views = await instances(p.bus, CLUSTER, finished=True)
            done = [v for v in views if v.task_id == task_id and v.instance.state == "succeeded"]
            return done[0] if done else None

        view = await wait_for(finished, timeout=20, what="the task's instance succeeded")
        assert view.instance.termination_cause == "task-completed"

        async def gone() -> bool:
            return ns not in kc.objects("v1/namespaces", None)

        await wait_for(gone, timeout=20, what="the task's namespace deleted")


@pytest.mark.slow
async def test_a_terminal_warning_event_before_running_is_install_failed(tmp_path: Path) -> None:
    chart = write_chart(tmp_path / "chart", templates={"i.yaml": INFERENCE, "s.yaml": SERVICE})
    async with helm_platform(tmp_path) as (kc, p):
        await registered(p, CLUSTER, {"H100": 16, "L40S": 4})
        _, _, d = await create(p.admin, helm_function(chart))
        await deploy(p.admin, d, spec("H100"))
        ns, _ = await installed(kc, "deployments", "inference")
        worker = worker_pod(kc, ns)
        # The ReplicaSet cannot make its pods (a quota): the event the controller would record.
        await kc._request(
            "POST",
            f"/api/v1/namespaces/{ns}/events",
            {
                "apiVersion": "v1", "kind": "Event", "type": "Warning", "reason": "FailedCreate",
                "metadata": {"name": "inference-5d8.1", "namespace": ns},
                "involvedObject": {"kind": "ReplicaSet", "name": "inference-5d8", "namespace": ns},
                "message": 'Error creating: pods "inference-5d8-x" is forbidden: exceeded quota: gpu',
            },
        )  # fmt: skip

        view = await ended(p, CLUSTER, worker, "failed")
        assert "FailedCreate" in (view.instance.error_log or "") and "exceeded quota" in (view.instance.error_log or "")
        (ms,) = [
            obj for (res, _, _), obj in kc.server.objects.items() if res.plural == "miniservices"
        ]  # fmt: skip
        phases = [(h.raw.get("status") or {}).get("phase") for h in ms.history if h is not None]
        assert "InstallFailed" in phases and "Failed" not in phases and "Running" not in phases


@pytest.mark.slow
async def test_the_charts_containers_write_to_the_functions_logs_endpoint(tmp_path: Path) -> None:
    """Every container of the chart's pods is followed, each line marked with its pod and container; a pod
    that goes stops being followed, and one that comes is followed. The worker's pod is the platform's
    and is not sent.
    """
    chart = write_chart(tmp_path / "chart", templates={"i.yaml": INFERENCE, "s.yaml": SERVICE, "m.yaml": SIDECAR})
    async with otlp_receiver() as (url, got), helm_platform(tmp_path, **LOOPBACK) as (kc, p):
        chosen = {"logsTelemetryId": await telemetry_endpoint(p.admin, url, "LOGS")}
        ns, worker, d = await start_sample(kc, p, chart, telemetries=chosen)
        kc.write_log(worker, "utils", "the worker's own line")
        kc.write_log("inference-abc12", "server", "model loaded")
        kc.write_log("metrics-def34", "exporter", "scraping")

        def sent() -> list[tuple[str, str, str]]:
            return [
                (r["body"], r["resource"].get("k8s.pod.name", ""), r["resource"].get("k8s.container.name", ""))
                for r in got.records
            ]

        async def has(*want: tuple[str, str, str]) -> bool:
            return sorted(sent()) == sorted(want)

        first = (("model loaded", "inference-abc12", "server"), ("scraping", "metrics-def34", "exporter"))
        await wait_for(lambda: has(*first), timeout=20, what="the chart's first lines")
        assert {r["resource"]["service.instance.id"] for r in got.records} == {worker}
        assert {r["resource"]["service.name"] for r in got.records} == {"inference-test"}
        assert worker not in {q["_pod"] for q in kc.server.log_requests}

        # The sidecar's pod is replaced: the old one is no longer followed, the new one is.
        def reads_of_the_old_pod() -> int:
            return sum(q["_pod"] == "metrics-def34" for q in kc.server.log_requests)

        before, deleted_at = reads_of_the_old_pod(), time.monotonic()
        await kc.delete_pod("metrics-def34", namespace=ns)
        _, metrics = await installed(kc, "deployments", "metrics")
        await kc.create_pod(pod_from(metrics, ns, "metrics-ghi56"))
        await kc.set_pod_status("metrics-ghi56", ready_status(), namespace=ns)
        kc.write_log("metrics-ghi56", "exporter", "scraping again")
        again = ("scraping again", "metrics-ghi56", "exporter")
        await wait_for(lambda: has(*first, again), timeout=20, what="the new pod's line")
        # Following it still would read it again and again (1 s, then 2, 4, ... apart): 8 s show three reads.
        await anyio.sleep(max(0.0, 8.0 - (time.monotonic() - deleted_at)))
        assert reads_of_the_old_pod() - before <= 1, "a pod that is gone is still followed"

        # Undeployed: what was written before goes out; then nothing is followed any more.
        kc.write_log("inference-abc12", "server", "shutting down")
        assert (await p.admin.delete(d)).status == 200
        last = ("shutting down", "inference-abc12", "server")
        await wait_for(lambda: has(*first, again, last), timeout=20, what="the last line")
        await anyio.sleep(1.0)
        asked = len(kc.server.log_requests)
        await anyio.sleep(2.5)
        assert len(kc.server.log_requests) == asked, "the agent still follows a released instance's pods"
        assert got.auth == {f"Bearer {TOKEN}"}


@pytest.mark.slow
async def test_the_next_agent_sends_a_helm_instances_output_from_then_on(tmp_path: Path) -> None:
    chart = write_chart(tmp_path / "chart", templates={"i.yaml": INFERENCE, "s.yaml": SERVICE})
    async with otlp_receiver() as (url, got), emulated_cluster(tmp_path) as kc:
        await gpu_nodes(kc)
        clusters = [k8s_cluster("gpu-a", CLUSTER, kc.kubeconfig, allow_local_charts=True)]
        settings = {**LOCAL, **LOOPBACK}

        def bodies() -> list[str]:
            return [r["body"] for r in got.records]

        async def sent(*want: str) -> bool:
            return bodies() == list(want)

        async with compute_platform(tmp_path, clusters, **settings) as p:
            chosen = {"logsTelemetryId": await telemetry_endpoint(p.admin, url, "LOGS")}
            await registered(p, CLUSTER, {"H100": 16, "L40S": 4})
            _, _, d = await create(p.admin, {**helm_function(chart), "telemetries": chosen})
            await deploy(p.admin, d, spec("H100"))
            ns, inference = await installed(kc, "deployments", "inference")
            await kc.create_pod(pod_from(inference, ns, "inference-abc12"))
            for name in (worker_pod(kc, ns), "inference-abc12"):
                await kc.set_pod_status(name, ready_status(), namespace=ns)
            kc.write_log("inference-abc12", "server", "model loaded")
            await wait_for(lambda: sent("model loaded"), timeout=20, what="the first line")
        # The agent stopped; the chart's pod did not. The next agent installs again and follows from now on.
        async with compute_platform(tmp_path, clusters, **settings) as p:
            await running(p.bus, CLUSTER)
            await wait_status(p.admin, d, "ACTIVE")
            await anyio.sleep(1.0)
            kc.write_log("inference-abc12", "server", "after the restart")
            await wait_for(lambda: sent("model loaded", "after the restart"), timeout=20, what="the new line")
            await anyio.sleep(1.5)
            assert bodies() == ["model loaded", "after the restart"]
