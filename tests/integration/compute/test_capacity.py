"""Capacity: placement follows the agent's GPUs, and the agent never runs a request twice."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from nvcf_mono.bus.codec import TypedKV
from nvcf_mono.contracts import buckets, subjects
from nvcf_mono.contracts.messages import encode
from nvcf_mono.structure import evolve
from nvcf_mono.testing.platform import deployment, wait_for, wait_status

from .conftest import (
    CLUSTER_A,
    all_gone,
    cluster,
    cluster_pids,
    compute_platform,
    create,
    deploy,
    function,
    instances,
    pids,
    running,
    spec,
)


@pytest.mark.slow
async def test_a_deployment_waits_for_capacity_and_takes_what_an_undeploy_frees(tmp_path: Path) -> None:
    # 3 nodes x 4 H100; another function holds two _2x instances, so 8 GPUs are free for the big one.
    async with compute_platform(tmp_path, [cluster("local", CLUSTER_A, "H100", count=4, nodes=3)]) as p:
        _, _, other = await create(p.admin, function("other"))
        await deploy(p.admin, other, spec(size=2, min_instances=2))
        await wait_status(p.admin, other, "ACTIVE")
        _, _, big = await create(p.admin, function("big"))
        await deploy(p.admin, big, spec(size=2, min_instances=6))

        async def four_running() -> dict | None:
            placement = (await deployment(p.admin, big))["deploymentSpecifications"][0]["placement"]
            return placement if placement["runningInstances"] == 4 and placement["waitingInstances"] == 2 else None

        placement = await wait_for(four_running, timeout=60, what="4 running, 2 waiting")
        assert "capacity" in placement["waitingReason"]
        assert (await deployment(p.admin, big))["functionStatus"] == "DEPLOYING"
        held = await running(p.bus, CLUSTER_A, count=6)
        # Each _2x instance has two devices of one node; no device is given twice.
        devices = [(v.instance.node, d) for v in held for d in v.instance.devices]
        assert len(devices) == 12 == len(set(devices))
        assert all(len(v.instance.devices) == 2 for v in held)

        await p.admin.delete(other)
        dep = await wait_status(p.admin, big, "ACTIVE", timeout=60)
        assert dep["deploymentSpecifications"][0]["placement"]["runningInstances"] == 6
        await p.admin.delete(big)
        await wait_for(lambda: _none_left(), timeout=30, what="every instance stopped")


async def _none_left() -> bool:
    return cluster_pids(CLUSTER_A) == []


@pytest.mark.slow
async def test_a_redelivered_creation_message_starts_nothing(tmp_path: Path) -> None:
    async with compute_platform(tmp_path) as p:
        fid, _, d = await create(p.admin, function())
        await deploy(p.admin, d, spec())
        await wait_status(p.admin, d, "ACTIVE")
        (view,) = await running(p.bus, CLUSTER_A)
        before = sorted(cluster_pids(CLUSTER_A))
        # The message as the agent received it, delivered once more (a new msg-id: not a stream duplicate).
        records = TypedKV(p.bus.kv(buckets.AGENT_REQUESTS.name), buckets.AGENT_REQUEST)
        stored = await records.get(buckets.agent_request_key(CLUSTER_A, view.request_id))
        assert stored is not None
        msg = stored.value.message
        stream = p.bus.stream(subjects.CREATE_STREAM)
        subject = subjects.create_subject("Function", CLUSTER_A, msg.gpu_type, msg.instance_type_name)
        await stream.publish(subject, encode(msg), msg_id=f"{msg.request_id}-again")
        durable = subjects.agent_durable(subjects.CREATE_STREAM, CLUSTER_A)

        async def taken() -> bool:
            info = await stream.consumer_info(durable)
            return info.num_pending == 0 and info.num_ack_pending == 0 and (await stream.info()).messages == 0

        await wait_for(taken, what="the redelivery to be acked")
        assert sorted(cluster_pids(CLUSTER_A)) == before
        assert [v.request_id for v in await instances(p.bus, CLUSTER_A)] == [view.request_id]
        reply = await p.key.post(f"/v2/nvcf/pexec/functions/{fid}", {"message": "once"})
        assert reply.status == 200
        await p.admin.delete(d)
        await all_gone(pids([view]))


@pytest.mark.slow
async def test_a_message_that_does_not_fit_waits_and_one_not_wanted_is_dropped(tmp_path: Path) -> None:
    async with compute_platform(tmp_path) as p:
        _, _, d = await create(p.admin, function())
        await deploy(p.admin, d, spec(size=8))  # every GPU of the cluster
        await wait_status(p.admin, d, "ACTIVE")
        (view,) = await running(p.bus, CLUSTER_A)
        records = TypedKV(p.bus.kv(buckets.AGENT_REQUESTS.name), buckets.AGENT_REQUEST)
        stored = await records.get(buckets.agent_request_key(CLUSTER_A, view.request_id))
        assert stored is not None
        # A request the control plane never made (as after a race): it needs 2 GPUs, none is free.
        stray = evolve(stored.value.message, request_id=str(uuid.uuid4()), requested_gpu_count=2)
        stream = p.bus.stream(subjects.CREATE_STREAM)
        subject = subjects.create_subject("Function", CLUSTER_A, "H100", "ON-PREM.GPU.H100_2x")
        await stream.publish(subject, encode(stray), msg_id=stray.request_id)
        durable = subjects.agent_durable(subjects.CREATE_STREAM, CLUSTER_A)

        async def naked_again() -> bool:
            return (await stream.consumer_info(durable)).num_redelivered >= 1

        await wait_for(naked_again, what="the message redelivered after a nak")
        assert await records.get(buckets.agent_request_key(CLUSTER_A, stray.request_id)) is None
        await p.admin.delete(d)
        await all_gone(pids([view]))

        async def dropped() -> object:
            found = await records.get(buckets.agent_request_key(CLUSTER_A, stray.request_id))
            return found.value if found is not None and found.value.finished_at else None

        record = await wait_for(dropped, timeout=20, what="the request taken, refused and dropped")
        assert record.status.value == "RequestFailureAcknowledged" and "not wanted" in (record.error or "")
        assert cluster_pids(CLUSTER_A) == []
        assert (await stream.info()).messages == 0
