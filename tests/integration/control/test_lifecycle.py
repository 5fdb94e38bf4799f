"""Placement and the function-version lifecycle against a scripted agent on the real bus.

The agent is scripted (there is no compute plane in these tests): it registers a cluster, takes
creation and termination messages from its durables and reports instance states as told.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from nvcf_mono.contracts import states, subjects
from nvcf_mono.contracts.messages import CreationMessage
from nvcf_mono.testing.platform import Api, deployment, wait_for, wait_status
from nvcf_mono.testing.scripted_agent import gpu_inventory

from .conftest import CONTAINER_FUNCTION, agent, platform

H100_1X = "ON-PREM.GPU.H100_1x"
H100_2X = "ON-PREM.GPU.H100_2x"


def spec(min_instances: int, max_instances: int | None = None, instance_type: str = H100_1X, **extra: Any) -> dict:
    return {
        "gpu": "H100",
        "instanceType": instance_type,
        "minInstances": min_instances,
        "maxInstances": max_instances if max_instances is not None else max(min_instances, 1),
        **extra,
    }


async def new_function(api: Api, name: str = "echo") -> tuple[str, str, str]:
    reply = await api.post("/v2/nvcf/functions", {**CONTAINER_FUNCTION, "name": name})
    assert reply.status == 200, reply.body
    fn = reply.json["function"]
    return fn["id"], fn["versionId"], f"/v2/nvcf/deployments/functions/{fn['id']}/versions/{fn['versionId']}"


async def test_min_zero_is_active_at_once_and_places_nothing(tmp_path: Path) -> None:
    async with platform(tmp_path) as p, agent(p.bus) as fake:
        _, _, d = await new_function(p.admin)
        reply = await p.admin.post(d, {"deploymentSpecifications": [spec(0, 2)]})
        assert reply.status == 200
        assert reply.json["deployment"]["functionStatus"] == "ACTIVE"
        placement = (await deployment(p.admin, d))["deploymentSpecifications"][0]["placement"]
        assert placement["desiredInstances"] == 0 and placement["placedInstances"] == 0
        assert fake.creations == []


async def test_deploying_becomes_active_and_creation_messages_carry_the_contract(tmp_path: Path) -> None:
    async with platform(tmp_path) as p, agent(p.bus) as fake:
        fid, vid, d = await new_function(p.admin)
        reply = await p.admin.post(d, {"deploymentSpecifications": [spec(2, 3)]})
        assert reply.status == 200
        dep = reply.json["deployment"]
        assert dep["functionStatus"] == "DEPLOYING"
        spec_id = dep["deploymentSpecifications"][0]["gpuSpecificationId"]
        await wait_status(p.admin, d, "ACTIVE")
        assert len(fake.creations) == 2
        msg: CreationMessage = fake.creations[0]
        assert msg.cluster_id == fake.cluster_id and msg.instance_count == 1
        assert msg.gpu_specification_id == spec_id and msg.deployment_id == dep["deploymentId"]
        assert msg.function_details is not None and msg.function_details.function_version_id == vid
        env = msg.launch_specification.environment
        assert env["INFERENCE_CONTAINER"] == CONTAINER_FUNCTION["containerImage"]
        assert env["INFERENCE_PORT"] == "9000" and env["INFERENCE_HEALTH_ENDPOINT"] == "/health"
        assert env["FUNCTION_ID"] == fid and env["NVCF_WORKER_TOKEN"].startswith("nvcft_")
        assert len({c.launch_specification.environment["NVCF_WORKER_TOKEN"] for c in fake.creations}) == 2
        fn = (await p.key.get(f"/v2/nvcf/functions/{fid}/versions/{vid}")).json["function"]
        assert fn["status"] == "ACTIVE"
        assert {i["instanceStatus"] for i in fn["activeInstances"]} == {"ACTIVE"} and len(fn["activeInstances"]) == 2
        stored = await p.bus.stream(subjects.CREATE_STREAM).info()
        assert stored.messages == 0  # work queue: taken by the agent's durable


@pytest.mark.slow
async def test_a_failure_below_min_is_replaced_and_a_lost_instance_degrades(tmp_path: Path) -> None:
    first = True

    def flaky(_: CreationMessage) -> Any:
        nonlocal first
        if first:
            first = False
            return "fail"
        return "run"

    async with platform(tmp_path) as p, agent(p.bus, behaviour=flaky) as fake:
        _, _, d = await new_function(p.admin)
        await p.admin.post(d, {"deploymentSpecifications": [spec(1, 1)]})
        dep = await wait_status(p.admin, d, "ACTIVE")
        assert len(fake.creations) == 2  # the failed one was replaced
        placement = dep["deploymentSpecifications"][0]["placement"]
        assert placement["failedInstances"] == 1 and "container-restart-loop" in placement["lastFailure"]
        # The running instance turns unhealthy for good: DEGRADED (nothing ready), then replaced.
        running = fake.live()[0]
        await fake.report(running.request_id, states.DEGRADED_WORKER, error="health check failing for 30m")
        await wait_for(lambda: _count(fake, 3), what="a replacement")
        await wait_status(p.admin, d, "ACTIVE")


async def _count(fake: Any, n: int) -> bool:
    return len(fake.creations) >= n


@pytest.mark.slow
async def test_every_instance_failing_puts_the_version_in_error_until_undeployed(tmp_path: Path) -> None:
    async with platform(tmp_path) as p, agent(p.bus, behaviour="fail") as fake:
        fid, vid, d = await new_function(p.admin)
        await p.admin.post(d, {"deploymentSpecifications": [spec(1, 1)]})
        dep = await wait_status(p.admin, d, "ERROR", timeout=20)
        assert len(fake.creations) == 3  # reconcile.deploy_failure_limit
        errors = [h["error"] for h in dep["healthInfo"]]
        assert len(errors) == 3 and all("inference server exited" in e for e in errors)
        assert {h["gpu"] for h in dep["healthInfo"]} == {"H100"} and dep["healthInfo"][0]["icmsRequestId"]
        again = await p.admin.post(d, {"deploymentSpecifications": [spec(1, 1)]})
        assert again.status == 400 and "already deployed" in again.detail
        assert (await deployment(p.admin, d))["functionStatus"] == "ERROR"  # sticky
        removed = await p.admin.delete(d)
        assert removed.status == 200 and removed.json["function"]["status"] == "INACTIVE"
        fn = await p.admin.get(f"/v2/nvcf/functions/{fid}/versions/{vid}")
        assert fn.json["function"]["status"] == "INACTIVE"


async def test_an_image_that_cannot_run_fails_the_deployment_at_once(tmp_path: Path) -> None:
    # A replacement is due almost at once after a failure: the failure itself must stop it, not the pause.
    quick_retry = {"plugins.control.reconcile.retry_backoff": "0.001"}
    async with platform(tmp_path, **quick_retry) as p, agent(p.bus, behaviour="fail-permanent") as fake:
        _, _, d = await new_function(p.admin)
        await p.admin.post(d, {"deploymentSpecifications": [spec(1, 1)]})
        dep = await wait_status(p.admin, d, "ERROR")
        assert len(fake.creations) == 1
        assert "image-pull-issues" in dep["healthInfo"][0]["error"]


async def test_bad_specs_are_refused_before_anything_is_published(tmp_path: Path) -> None:
    async with platform(tmp_path) as p, agent(p.bus) as fake:
        fid, vid, d = await new_function(p.admin)
        cases = [
            (spec(1, gpu="A100"), "Invalid GPU 'A100' specified"),
            (spec(1, instanceType="ON-PREM.GPU.H100_3x"), "Invalid InstanceType 'ON-PREM.GPU.H100_3x' specified"),
            (spec(1, instanceType="ON-PREM.GPU.A100_1x"), "Invalid InstanceType"),
            (spec(1, backend="nope"), "Invalid Backend 'nope' specified"),
            (spec(1, backend="local", clusters=["local"]), "Cannot specify both 'backend' and 'clusters'"),
            (spec(3, 2), "'minInstances' must be lesser than or equal to 'maxInstances'"),
            (spec(1, clusters=["elsewhere"]), "Invalid cluster 'elsewhere' specified"),
            (spec(1, configuration={"a": 1}), "'configuration' may only be given for a Helm function"),
            (spec(1, maxRequestConcurrency=0), "must be greater than or equal to 1"),
            (spec(1, regions=["mars"]), "No registered cluster offers"),
        ]
        for body, detail in cases:
            reply = await p.admin.post(d, {"deploymentSpecifications": [body]})
            assert reply.status == 400, (body, reply.body)
            assert detail in reply.detail, (body, reply.detail)
        empty = await p.admin.post(d, {"deploymentSpecifications": []})
        assert empty.status == 400 and "must not be empty" in empty.detail
        missing = await p.admin.post(d, {})
        assert missing.status == 400 and "deploymentSpecifications" in missing.detail
        assert (await p.bus.stream(subjects.CREATE_STREAM).info()).last_seq == 0
        assert fake.creations == []
        fn = await p.admin.get(f"/v2/nvcf/functions/{fid}/versions/{vid}")
        assert fn.json["function"]["status"] == "INACTIVE"


async def test_capacity_limits_placement_and_frees_on_undeploy(tmp_path: Path) -> None:
    # 3 nodes x 4 H100: twelve GPUs, room for six _2x instances.
    async with platform(tmp_path) as p, agent(p.bus, gpus=[gpu_inventory("H100", 4, nodes=3)]) as fake:
        _, _, other = await new_function(p.admin, "other")
        await p.admin.post(other, {"deploymentSpecifications": [spec(2, 2, H100_2X)]})
        await wait_status(p.admin, other, "ACTIVE")
        _, _, d = await new_function(p.admin, "big")
        await p.admin.post(d, {"deploymentSpecifications": [spec(6, 6, H100_2X)]})

        async def four_running() -> dict | None:
            placement = (await deployment(p.admin, d))["deploymentSpecifications"][0]["placement"]
            return placement if placement["runningInstances"] == 4 and placement["waitingInstances"] == 2 else None

        placement = await wait_for(four_running, what="4 placed, 2 waiting")
        assert "capacity" in placement["waitingReason"]
        assert (await deployment(p.admin, d))["functionStatus"] == "DEPLOYING"
        assert len(fake.creations) == 2 + 4
        await p.admin.delete(other)
        dep = await wait_status(p.admin, d, "ACTIVE")
        assert dep["deploymentSpecifications"][0]["placement"]["runningInstances"] == 6
        assert len(fake.creations) == 2 + 6


async def test_scaling_down_terminates_the_surplus(tmp_path: Path) -> None:
    async with platform(tmp_path) as p, agent(p.bus) as fake:
        _, _, d = await new_function(p.admin)
        dep = (await p.admin.post(d, {"deploymentSpecifications": [spec(3, 4)]})).json["deployment"]
        await wait_status(p.admin, d, "ACTIVE")
        patch = await p.admin.patch(
            f"/v2/nvcf/deployments/{dep['deploymentId']}/gpu-specifications/"
            f"{dep['deploymentSpecifications'][0]['gpuSpecificationId']}",
            {"minInstances": 1},
        )
        assert patch.status == 200 and patch.json["gpuSpecification"]["minInstances"] == 1

        async def one_left() -> bool:
            return len(fake.live()) == 1 and len(fake.terminations) == 2

        await wait_for(one_left, what="scale down to 1")
        assert (await deployment(p.admin, d))["functionStatus"] == "ACTIVE"


@pytest.mark.slow
async def test_graceful_undeploy_waits_for_the_queue_to_drain(tmp_path: Path) -> None:
    from nvcf_mono.contracts import streams as stream_specs

    async with platform(tmp_path) as p, agent(p.bus) as fake:
        _, vid, d = await new_function(p.admin)
        await p.admin.post(d, {"deploymentSpecifications": [spec(1, 1)]})
        await wait_status(p.admin, d, "ACTIVE")
        region = p.host.settings.node.region
        await p.bus.ensure_stream(
            stream_specs.request_stream(region, vid, max_msgs=100, max_msg_size=1024 * 1024, duplicate_window=30.0)
        )
        queue = p.bus.stream(subjects.request_stream(region, vid))
        await queue.ensure_consumer(stream_specs.request_consumer(region, vid, ack_wait=30))
        await queue.publish(subjects.request_subject(region, vid, "r1"), b"{}", msg_id="r1")

        removed = await p.admin.delete(d, params={"graceful": "true"})
        assert removed.status == 200 and removed.json["function"]["status"] == "INACTIVE"
        again = await p.admin.post(d, {"deploymentSpecifications": [spec(1, 1)]})
        assert again.status == 400 and "draining" in again.detail
        await anyio.sleep(1.5)  # several reconcile rounds: the instance must stay while work waits
        assert len(fake.live()) == 1 and fake.terminations == []

        async with queue.consume(subjects.worker_durable(region, vid), fetch_timeout=1.0) as deliveries:
            async for delivery in deliveries:
                await delivery.ack_sync()
                break

        async def gone() -> bool:
            return not fake.live() and (await p.admin.get(d)).status == 404

        await wait_for(gone, what="instances terminated and the deployment removed")
        redeployed = await p.admin.post(d, {"deploymentSpecifications": [spec(1, 1)]})
        assert redeployed.status == 200


async def test_a_version_deleted_while_it_is_deployed_leaves_no_deployment_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The delete found no deployment yet, the deploy found the version still there: both answered as
    # if alone, and a deployment of a deleted version stayed listed (DEPLOYING) for ever.
    from nvcf_mono.planes.control.api import deployments as deployments_api

    async with platform(tmp_path) as p, agent(p.bus) as fake:
        fid, vid, d = await new_function(p.admin)
        checked = deployments_api.check_values

        async def deleted_meanwhile(*args: Any) -> None:
            gone = await p.admin.delete(f"/v2/nvcf/functions/{fid}/versions/{vid}")
            assert gone.status == 204, gone.body
            await checked(*args)

        monkeypatch.setattr(deployments_api, "check_values", deleted_meanwhile)
        reply = await p.admin.post(d, {"deploymentSpecifications": [spec(1, 1)]})
        assert reply.status == 404, reply.body
        assert "deleted while it was being deployed" in reply.json["detail"]
        listed = await p.admin.get("/v2/nvcf/accounts/nvcf-default/deployments")
        assert fid not in {dep["functionId"] for dep in listed.json["deployments"]}
        assert (await p.admin.get(d)).status == 404

        async def nothing_runs() -> bool:
            return not fake.live()

        await wait_for(nothing_runs, timeout=15, what="no instance of the deleted version")


async def test_the_reconciler_removes_a_deployment_whose_version_is_gone(tmp_path: Path) -> None:
    # However it came about (the race above across two control nodes), a deployment without its
    # version is removed and its instances terminated.
    from nvcf_mono.contracts import buckets

    async with platform(tmp_path) as p, agent(p.bus) as fake:
        fid, vid, d = await new_function(p.admin)
        assert (await p.admin.post(d, {"deploymentSpecifications": [spec(1, 1)]})).status == 200
        await wait_status(p.admin, d, "ACTIVE")
        await p.bus.kv(buckets.FUNCTIONS.name).delete(buckets.version_key(fid, vid))  # the version only

        async def removed() -> bool:
            listed = await p.admin.get("/v2/nvcf/accounts/nvcf-default/deployments")
            return fid not in {dep["functionId"] for dep in listed.json["deployments"]} and not fake.live()

        await wait_for(removed, timeout=15, what="the orphaned deployment and its instance to go")
        assert fake.terminations  # terminated, not only forgotten
