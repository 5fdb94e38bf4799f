"""The all-in-one platform with a cluster on the Kubernetes backend, against the emulated API server.

The real control plane places instances, the real agent takes the creation messages from JetStream
and creates the objects; the test plays the kubelet. Nothing in the pods runs (there are no nodes),
so what is checked is what the agent creates, how it reads pod states, and what it reports.
"""

from __future__ import annotations

import base64
import json
import uuid
from pathlib import Path
from typing import Any

import anyio
import pytest

from nvcf_mono.testing.platform import wait_for, wait_status
from tests.integration.compute.conftest import compute_platform, create, deploy, function, instances, running, spec
from tests.integration.compute.test_telemetry_export import LOOPBACK, TOKEN, otlp_receiver, telemetry_endpoint
from tests.integration.kubernetes.conftest import (
    emulated_cluster,
    ended,
    gpu_nodes,
    k8s_cluster,
    one_pod,
    ready_status,
    registered,
    stamp,
    store_ngc_credential,
    validate,
)

CLUSTER = str(uuid.uuid4())
CLUSTERS = "/v1/accounts/nvcf-default/clusters"
IMAGE = "nvcr.io/acme/echo:1"
PODS = "v1/pods"
REQUESTS = "nvca.nvcf.nvidia.io/v2beta1/icmsrequests"


@pytest.mark.slow
async def test_gpu_nodes_register_instance_types_and_a_gpu_change_registers_again(tmp_path: Path) -> None:
    async with emulated_cluster(tmp_path) as kc:
        await gpu_nodes(kc)
        clusters = [k8s_cluster("gpu-a", CLUSTER, kc.kubeconfig)]
        async with compute_platform(tmp_path, clusters, **{"plugins.compute.inventory_interval": "0.5"}) as p:
            first = await registered(p, CLUSTER, {"H100": 16, "L40S": 4})
            types = {t["name"]: t for g in first["gpus"] for t in g["instanceTypes"]}
            assert {n: t["maxInstances"] for n, t in types.items()} == {
                "ON-PREM.GPU.H100_1x": 16,
                "ON-PREM.GPU.H100_2x": 8,
                "ON-PREM.GPU.H100_4x": 4,
                "ON-PREM.GPU.H100_8x": 2,
                "ON-PREM.GPU.H100_8x.x2": 1,
                "ON-PREM.GPU.L40S_1x": 4,
                "ON-PREM.GPU.L40S_2x": 2,
                "ON-PREM.GPU.L40S_4x": 1,
            }
            assert types["ON-PREM.GPU.L40S_1x"]["unschedulableCapacity"] == 4
            assert types["ON-PREM.GPU.H100_1x"]["cpuCores"] == 12
            # Every GPU node carries its instance-type label, which instance pods require.
            nodes = kc.objects("v1/nodes", None)
            assert nodes["h100-a"]["metadata"]["labels"]["nvca.nvcf.nvidia.io/instance-type"] == "ON-PREM.GPU.H100"
            assert nodes["l40s-b"]["metadata"]["labels"]["nvca.nvcf.nvidia.io/instance-type"] == "ON-PREM.GPU.L40S"
            assert "nvca.nvcf.nvidia.io/instance-type" not in nodes["system"]["metadata"]["labels"]

            # The not-Ready node comes back and another loses half its GPUs: registered again.
            await kc.patch_node("l40s-b", {"status": {"conditions": [{"type": "Ready", "status": "True"}]}})
            await kc.patch_node("h100-b", {"status": {"allocatable": {"nvidia.com/gpu": "4"}}})
            again = await registered(p, CLUSTER, {"H100": 12, "L40S": 8})
            types = {t["name"]: t["maxInstances"] for g in again["gpus"] for t in g["instanceTypes"]}
            assert types["ON-PREM.GPU.H100_8x"] == 1 and types["ON-PREM.GPU.H100_4x"] == 3
            assert "ON-PREM.GPU.H100_8x.x2" not in types


def nvcf_backend(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "nvcf.nvidia.io/v1",
        "kind": "NVCFBackend",
        "metadata": {"name": "ncp-local", "namespace": "nvca-operator"},
        "spec": {"clusterSource": "self-hosted", **spec},
    }


@pytest.mark.slow
async def test_the_clusters_nvcfbackend_decides_attributes_discovery_and_helm_and_gets_the_agents_status(
    tmp_path: Path,
) -> None:
    async with emulated_cluster(tmp_path) as kc:
        await gpu_nodes(kc)
        backend = nvcf_backend(
            clusterConfig={"attributes": ["NVLinkOptimized=true"], "gpuDiscovery": {"dynamic": {}}},
            featureGate={"values": ["-MultiNodeWorkloads", "-HelmMiniService"]},
        )
        path = "/apis/nvcf.nvidia.io/v1/namespaces/nvca-operator/nvcfbackends"
        await kc._request("POST", path, backend)
        clusters = [k8s_cluster("gpu-a", CLUSTER, kc.kubeconfig)]
        async with compute_platform(tmp_path, clusters, **{"plugins.compute.inventory_interval": "0.5"}) as p:
            first = await registered(p, CLUSTER, {"H100": 16, "L40S": 4})
            assert first["attributes"] == ["NVLinkOptimized=true"]
            assert "HelmMiniService" not in first["capabilities"]
            types = {t["name"] for g in first["gpus"] for t in g["instanceTypes"]}
            assert "ON-PREM.GPU.H100_8x.x2" not in types  # MultiNodeWorkloads off

            async def reported() -> dict[str, Any] | None:
                status = kc.objects("nvcf.nvidia.io/v1/nvcfbackends", "nvca-operator")["ncp-local"].get("status")
                return status if status and status.get("agentStatus") == "Healthy" else None

            status = await wait_for(reported, timeout=15, what="the agent's status in the NVCFBackend")
            assert status["lastUpdated"] and status["lastUpdatedAgentStatus"]

            # The operator switches to static discovery with its own inventory (overrides win): registered again.
            static = {"static": {"gpuConfig": [{"name": "A100", "capacity": 8,
                                                "instanceTypes": [{"gpuCount": 4, "gpuMemory": "40GB"}]}]}}  # fmt: skip
            await kc._request(
                "PATCH", f"{path}/ncp-local", {"spec": {"overrides": {"clusterConfig": {"gpuDiscovery": static}}}},
                "application/merge-patch+json",
            )  # fmt: skip
            again = await registered(p, CLUSTER, {"A100": 8})
            assert {t["name"] for g in again["gpus"] for t in g["instanceTypes"]} == {
                "ON-PREM.GPU.A100_1x", "ON-PREM.GPU.A100_2x", "ON-PREM.GPU.A100_4x",
            }  # fmt: skip


async def test_a_function_instance_is_a_pod_that_runs_when_ready_and_goes_when_undeployed(tmp_path: Path) -> None:
    async with emulated_cluster(tmp_path) as kc:
        await gpu_nodes(kc)
        async with compute_platform(tmp_path, [k8s_cluster("gpu-a", CLUSTER, kc.kubeconfig)]) as p:
            await registered(p, CLUSTER, {"H100": 16, "L40S": 4})
            fid, _, d = await create(p.admin, function("on-k8s", containerImage=IMAGE))
            await deploy(p.admin, d, spec("H100", size=2))
            pod = await one_pod(kc)
            name = pod["metadata"]["name"]
            (request,) = kc.objects(REQUESTS).values()
            assert name == f"0-{request['metadata']['name']}"
            assert request["spec"]["functionDetails"]["functionId"] == fid
            assert pod["metadata"]["ownerReferences"][0]["uid"] == request["metadata"]["uid"]
            inference = pod["spec"]["containers"][0]
            assert (inference["name"], inference["image"]) == ("inference", IMAGE)
            assert inference["resources"]["limits"] == {"nvidia.com/gpu": "2"}
            terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            assert terms["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == ["ON-PREM.GPU.H100"]
            for created in [*kc.created(PODS), *kc.created("v1/secrets")]:
                validate(created)

            # Scheduled, pulled, ready: the instance runs and the function is ACTIVE.
            (view,) = await instances(p.bus, CLUSTER)
            assert view.instance.state == "starting"
            await kc.set_pod_status(name, ready_status())
            (view,) = await running(p.bus, CLUSTER)
            assert view.instance.instance_id == name and view.function_id == fid
            await wait_status(p.admin, d, "ACTIVE")

            async def request_running() -> bool:
                (req,) = kc.objects(REQUESTS).values()
                status = req.get("status", {})
                reported = status.get("instances", {}).get(name, {})
                # The aggregate state (NVCA's Succeeded) and the instance state reported to the control plane.
                return reported.get("status") == "Succeeded" and reported.get("lastReportedStatus") == "running"

            await wait_for(request_running, timeout=10, what="the ICMSRequest's status")

            # Undeployed: the pod, its secret and its request go; the agent reports it terminated by the user.
            reply = await p.admin.delete(d)
            assert reply.status == 200, reply.body

            async def gone() -> bool:
                return not kc.objects(PODS) and not kc.objects("v1/secrets") and not kc.objects(REQUESTS)

            await wait_for(gone, timeout=20, what="the pod, its secret and its ICMSRequest deleted")

            done = await ended(p, CLUSTER, name, "terminated", timeout=15)
            assert done.instance.status == "instance-terminated-by-user"


async def test_an_image_that_cannot_be_pulled_fails_the_instance_and_its_pod_is_deleted(tmp_path: Path) -> None:
    async with emulated_cluster(tmp_path) as kc:
        await gpu_nodes(kc)
        clusters = [k8s_cluster("gpu-a", CLUSTER, kc.kubeconfig, image_pull_timeout="1")]
        async with compute_platform(tmp_path, clusters) as p:
            await registered(p, CLUSTER, {"H100": 16, "L40S": 4})
            _, _, d = await create(p.admin, function("bad-image", containerImage="nvcr.io/acme/missing:0"))
            await deploy(p.admin, d, spec("H100"))
            pod = await one_pod(kc)
            name = pod["metadata"]["name"]
            message = 'failed to pull image "nvcr.io/acme/missing:0": not found'
            await kc.set_pod_status(
                name,
                {
                    "phase": "Pending",
                    "startTime": stamp(3),
                    "conditions": [{"type": "PodScheduled", "status": "True"}],
                    "containerStatuses": [
                        {
                            "name": "inference",
                            "ready": False,
                            "restartCount": 0,
                            "state": {"waiting": {"reason": "ImagePullBackOff", "message": message}},
                        }
                    ],
                },
            )

            view = await ended(p, CLUSTER, name, "image-pull-issues", timeout=15)
            assert view.instance.status == "instance-terminated-by-service"
            assert view.instance.termination_cause == "image-pull-issues"
            assert view.instance.error_log is not None and "ImagePullBackOff" in view.instance.error_log

            async def deleted() -> bool:
                return name not in kc.objects(PODS)

            await wait_for(deleted, timeout=10, what="the failed pod deleted")


@pytest.mark.slow
async def test_a_pod_that_does_not_fit_is_no_capacity_and_a_vanished_pod_is_not_found(tmp_path: Path) -> None:
    async with emulated_cluster(tmp_path) as kc:
        await gpu_nodes(kc)
        clusters = [k8s_cluster("gpu-a", CLUSTER, kc.kubeconfig, scheduling_timeout="1")]
        async with compute_platform(tmp_path, clusters) as p:
            await registered(p, CLUSTER, {"H100": 16, "L40S": 4})
            _, _, d = await create(p.admin, function("no-room", containerImage=IMAGE))
            await deploy(p.admin, d, spec("L40S"))
            name = (await one_pod(kc))["metadata"]["name"]
            unschedulable = {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "lastTransitionTime": stamp(2),
                "message": "0/5 nodes are available: 4 Insufficient nvidia.com/gpu.",
            }
            await kc.set_pod_status(name, {"phase": "Pending", "conditions": [unschedulable]})

            view = await ended(p, CLUSTER, name, "instance-terminated-no-capacity", timeout=15)
            assert "Insufficient nvidia.com/gpu" in (view.instance.error_log or "")

            # The control plane asks for a replacement; someone deletes its pod by hand.
            async def replacement() -> str | None:
                names = [n for n in kc.objects(PODS) if n != name]
                return names[0] if names else None

            second = await wait_for(replacement, timeout=20, what="a replacement pod")
            await kc.set_pod_status(second, ready_status())
            await running(p.bus, CLUSTER)
            await kc.delete_pod(second)
            await ended(p, CLUSTER, second, "instance-not-found", timeout=15)


async def test_the_accounts_registry_credential_becomes_the_pods_pull_secret(tmp_path: Path) -> None:
    async with emulated_cluster(tmp_path) as kc:
        await gpu_nodes(kc)
        async with compute_platform(tmp_path, [k8s_cluster("gpu-a", CLUSTER, kc.kubeconfig)]) as p:
            await registered(p, CLUSTER, {"H100": 16, "L40S": 4})
            await store_ngc_credential(p, "nvapi-KEY-0001")
            secret = base64.b64encode(b"$oauthtoken:nvapi-KEY-0001").decode()
            _, _, d = await create(p.admin, function("private", containerImage=IMAGE))
            await deploy(p.admin, d, spec("H100"))
            pod = await one_pod(kc)
            pulls = [s["name"] for s in pod["spec"]["imagePullSecrets"]]
            regcred = kc.objects("v1/secrets")[pulls[0]]
            assert regcred["type"] == "kubernetes.io/dockerconfigjson"
            config = json.loads(base64.b64decode(regcred["data"][".dockerconfigjson"]))
            assert base64.b64decode(config["auths"]["nvcr.io"]["auth"]) == b"$oauthtoken:nvapi-KEY-0001"
            # Never in the pod spec nor in the ICMSRequest, which more people may read.
            (request,) = kc.objects(REQUESTS).values()
            assert b"nvapi-KEY-0001" not in json.dumps([pod, request]).encode()
            assert secret not in json.dumps([pod, request])


@pytest.mark.slow
async def test_a_task_runs_once_in_a_pod_with_its_worker_as_a_sidecar_and_completes_with_its_exit_code(
    tmp_path: Path,
) -> None:
    async with emulated_cluster(tmp_path) as kc:
        await gpu_nodes(kc)
        async with compute_platform(tmp_path, [k8s_cluster("gpu-a", CLUSTER, kc.kubeconfig)]) as p:
            await registered(p, CLUSTER, {"H100": 16, "L40S": 4})
            made = await p.admin.post(
                "/v1/nvct/tasks",
                {
                    "name": "train",
                    "containerImage": "nvcr.io/acme/train:1",
                    "gpuSpecification": {"gpu": "H100", "instanceType": "ON-PREM.GPU.H100_1x"},
                    "maxRuntimeDuration": "PT1H",
                },
            )
            assert made.status == 200, made.body
            task_id = made.json["task"]["id"]
            pod = await one_pod(kc)
            validate(pod)
            assert pod["spec"]["restartPolicy"] == "Never"
            assert pod["spec"]["activeDeadlineSeconds"] == 3600
            assert [c["name"] for c in pod["spec"]["containers"]] == ["task"]
            (utils,) = pod["spec"]["initContainers"]
            assert (utils["name"], utils["restartPolicy"]) == ("utils", "Always")
            assert pod["metadata"]["labels"]["nvca.nvcf.nvidia.io/task-id"] == task_id
            name = pod["metadata"]["name"]
            exited = {
                "phase": "Failed",
                "startTime": stamp(5),
                "containerStatuses": [
                    {"name": "task", "restartCount": 0, "state": {"terminated": {"exitCode": 2, "reason": "Error"}}}
                ],
            }
            await kc.set_pod_status(name, exited)

            view = await ended(p, CLUSTER, name, "failed", timeout=15)
            assert view.instance.termination_cause == "task-failed"
            assert "exited with code 2" in (view.instance.error_log or "")

            async def task_errored() -> Any:
                task = (await p.admin.get(f"/v1/nvct/tasks/{task_id}")).json["task"]
                return task if task["status"] == "ERRORED" else None

            await wait_for(task_errored, timeout=15, what="the task ERRORED")


@pytest.mark.slow
async def test_pods_outlive_an_agent_restart_and_the_next_agent_takes_them_over(tmp_path: Path) -> None:
    async with emulated_cluster(tmp_path) as kc:
        await gpu_nodes(kc)
        clusters = [k8s_cluster("gpu-a", CLUSTER, kc.kubeconfig)]
        async with compute_platform(tmp_path, clusters) as p:
            await registered(p, CLUSTER, {"H100": 16, "L40S": 4})
            _, _, d = await create(p.admin, function("long-lived", containerImage=IMAGE))
            await deploy(p.admin, d, spec("H100"))
            pod = await one_pod(kc)
            await kc.set_pod_status(pod["metadata"]["name"], ready_status())
            (before,) = await running(p.bus, CLUSTER)
        # The agent stopped; its pod did not.
        (left,) = kc.objects(PODS).values()
        assert left["metadata"]["uid"] == pod["metadata"]["uid"]
        async with compute_platform(tmp_path, clusters) as p:
            (after,) = await running(p.bus, CLUSTER)
            assert after.instance.instance_id == before.instance.instance_id
            await wait_status(p.admin, d, "ACTIVE")
            (still,) = kc.objects(PODS).values()
            assert still["metadata"]["uid"] == pod["metadata"]["uid"]  # taken over, not created again
            assert len(kc.created(PODS)) == 1


async def test_function_secrets_are_mounted_from_the_instances_secret_and_kept_current(tmp_path: Path) -> None:
    async with emulated_cluster(tmp_path) as kc:
        await gpu_nodes(kc)
        cluster = k8s_cluster("gpu-a", CLUSTER, kc.kubeconfig, secrets_refresh="0.5")
        async with compute_platform(tmp_path, [cluster]) as p:
            await registered(p, CLUSTER, {"H100": 16, "L40S": 4})
            body = function("secretive", containerImage=IMAGE, secrets=[{"name": "API_KEY", "value": "s3cr3t"}])
            _, _, d = await create(p.admin, body)
            await deploy(p.admin, d, spec("H100"))
            pod = await one_pod(kc)
            name = pod["metadata"]["name"]
            secret = kc.objects("v1/secrets")[f"{name}-secrets"]
            assert json.loads(base64.b64decode(secret["data"]["secrets.json"])) == {"API_KEY": "s3cr3t"}
            assert base64.b64decode(secret["data"]["worker-token"])  # the worker reads its token from here
            mounts = {m["name"]: m for c in pod["spec"]["containers"] for m in c["volumeMounts"]}
            assert mounts["secret-data"] == {"name": "secret-data", "mountPath": "/var/secrets", "readOnly": True}
            assert b"s3cr3t" not in json.dumps(pod).encode()
            worker_env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][-1]["env"]}
            # The mount is read-only, the agent updates it: the worker has no file to write (it still asks
            # every secrets_refresh, for its telemetry endpoints' secrets).
            assert "SECRETS_FILE" not in worker_env and worker_env["FUNCTION_SECRETS_PRESENT"] == "false"

            # Rotated, and the account's first secret: the running instance's Secret follows (the kubelet
            # then swaps the mounted file), without a redeploy.
            fid, vid = d.rsplit("/", 3)[-3], d.rsplit("/", 1)[-1]
            rotated = {"secrets": [{"name": "API_KEY", "value": "r0tated"}]}
            assert (await p.admin.put(f"/v2/nvcf/secrets/functions/{fid}/versions/{vid}", rotated)).status == 204
            shared = {"secrets": [{"name": "SHARED", "value": "acct"}]}
            assert (await p.admin.put("/v2/nvcf/secrets/account", shared)).status == 204

            async def updated() -> bool:
                data = kc.objects("v1/secrets")[f"{name}-secrets"]["data"]["secrets.json"]
                return json.loads(base64.b64decode(data)) == {"API_KEY": "r0tated", "SHARED": "acct"}

            await wait_for(updated, timeout=15, what="the instance's Secret updated")


@pytest.mark.slow
async def test_the_function_containers_log_goes_to_its_logs_endpoint_once_across_restarts(tmp_path: Path) -> None:
    """The agent follows the inference container's log (timestamps on) and posts it as OTLP log records.
    A stream cut short is followed again from a little before its last line, whose earlier lines are
    not sent twice; a restarted container's new log is followed too. The worker's own log (the
    ``utils`` container) is not the function's and is not sent. A secret replaced meanwhile is sent with from
    the agent's next look at the instance's secrets on.
    """
    async with otlp_receiver() as (url, got), emulated_cluster(tmp_path) as kc:
        await gpu_nodes(kc)
        cluster = k8s_cluster("gpu-a", CLUSTER, kc.kubeconfig, secrets_refresh="0.5")
        async with compute_platform(tmp_path, [cluster], **LOOPBACK) as p:
            await registered(p, CLUSTER, {"H100": 16, "L40S": 4})
            tid = await telemetry_endpoint(p.admin, url, "LOGS")
            chosen = {"logsTelemetryId": tid}
            fid, _, d = await create(p.admin, function("on-k8s", containerImage=IMAGE, telemetries=chosen))
            await deploy(p.admin, d, spec("H100"))
            name = (await one_pod(kc))["metadata"]["name"]
            kc.write_log(name, "utils", "the worker's own line")
            await kc.set_pod_status(name, ready_status())
            await running(p.bus, CLUSTER)
            kc.write_log(name, "inference", "model loaded", "", "listening on :9000")

            def bodies() -> list[str]:
                return [r["body"] for r in got.records]

            async def sent(*want: str) -> bool:
                return bodies() == list(want)

            await wait_for(lambda: sent("model loaded", "listening on :9000"), timeout=20, what="the first lines")
            (record, *_) = got.records
            assert record["resource"]["service.instance.id"] == name
            assert record["resource"]["nvcf.function_id"] == fid and record["resource"]["service.name"] == "on-k8s"
            follows = [q for q in kc.server.log_requests if q.get("follow") == "True"]
            assert {q["container"] for q in follows} == {"inference"} and follows[0].get("timestamps") == "True"
            assert "sinceSeconds" not in follows[-1]  # from the container's start

            # Cut short: followed again from before the last line; what came before is skipped.
            kc.cut_log_streams(name, "inference")

            async def followed_again() -> bool:
                return any("sinceSeconds" in q for q in kc.server.log_requests if q.get("follow") == "True")

            await wait_for(followed_again, timeout=20, what="the log followed again")
            kc.write_log(name, "inference", "still here")
            await wait_for(
                lambda: sent("model loaded", "listening on :9000", "still here"), timeout=20, what="one more line"
            )

            kc.restart_container(name, "inference")
            kc.write_log(name, "inference", "started again")
            await wait_for(
                lambda: sent("model loaded", "listening on :9000", "still here", "started again"),
                timeout=20,
                what="the restarted container's line",
            )

            # A new secret: the next lines go with it.
            rotated = "tenant-OTLP-token-8"
            got.tokens.add(rotated)
            secret = {"secret": {"name": "collector", "value": rotated}}
            assert (await p.admin.put(f"/v2/nvcf/secrets/telemetries/{tid}", secret)).status == 204
            lines = 0

            async def rotated_sent() -> bool:
                nonlocal lines
                if any(r["body"].startswith("rotated") and r["auth"] == f"Bearer {rotated}" for r in got.records):
                    return True
                lines += 1
                kc.write_log(name, "inference", f"rotated {lines}")  # a line a round until one goes with it
                await anyio.sleep(0.5)
                return False

            await wait_for(rotated_sent, timeout=20, what="a line after the rotation, with the new token")

            # Undeployed: the lines written before the pod went still go out; then the agent stops asking.
            kc.write_log(name, "inference", "shutting down")
            assert (await p.admin.delete(d)).status == 200
            await wait_for(lambda: _last_is(bodies(), "shutting down"), timeout=20, what="the last line")
            asked = len(kc.server.log_requests)
            await anyio.sleep(2.5)
            assert len(kc.server.log_requests) == asked, "the agent still follows a released instance's log"
            assert bodies().count("model loaded") == 1
            assert got.auth == {f"Bearer {TOKEN}", f"Bearer {rotated}"}


async def _last_is(bodies: list[str], line: str) -> bool:
    return bodies[-1:] == [line]
