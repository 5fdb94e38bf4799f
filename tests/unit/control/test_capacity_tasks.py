"""Tasks hold their cluster's GPUs in the placement view (deployments and tasks share clusters)."""

from __future__ import annotations

import pytest

from nvcf_mono.models.cluster import Cluster, ClusterGpu, InstanceType
from nvcf_mono.models.task import (
    ResultHandlingStrategy,
    Task,
    TaskGpuSpecification,
    TaskInstance,
    TaskStatus,
)
from nvcf_mono.planes.control.catalog import Capacity

IT = InstanceType(name="ON-PREM.GPU.H100_1x", value="ON-PREM.GPU.H100", gpu_count=1, max_instances=8)
CLUSTER = Cluster(
    cluster_id="c1",
    cluster_name="one",
    cluster_group_name="one",
    cluster_group_id="g1",
    nca_id="nca",
    region="local",
    cloud_provider="ON-PREM",
    gpus=(ClusterGpu(name="H100", capacity=1, instance_types=(IT,)),),
    registered_at="2026-01-01T00:00:00.000Z",
)


def _task(status: TaskStatus, instance_state: str | None) -> Task:
    instances = (
        (
            TaskInstance(
                instance_id="i", instance_state=instance_state, gpu="H100", instance_type=IT.name, backend="one"
            ),
        )
        if instance_state
        else ()
    )
    return Task(
        id="t",
        nca_id="nca",
        name="t",
        status=status,
        gpu_specification=TaskGpuSpecification(gpu="H100", instance_type=IT.name),
        created_at="2026-01-01T00:00:00.000Z",
        last_updated_at="2026-01-01T00:00:00.000Z",
        result_handling_strategy=ResultHandlingStrategy.UPLOAD,
        max_queued_duration="PT72H",
        termination_grace_period_duration="PT1H",
        cluster_id="c1",
        request_id="r",
        instances=instances,
    )


@pytest.mark.parametrize(
    ("status", "instance_state", "room"),
    [
        pytest.param(TaskStatus.QUEUED, None, False, id="placed, not started yet"),
        pytest.param(TaskStatus.RUNNING, "RUNNING", False, id="running"),
        pytest.param(TaskStatus.CANCELED, "RUNNING", False, id="canceled, still stopping"),
        pytest.param(TaskStatus.COMPLETED, "TERMINATED", True, id="finished and gone"),
        pytest.param(TaskStatus.ERRORED, None, True, id="ended before it had an instance"),
    ],
)
def test_a_task_holds_its_gpu_until_its_instance_is_gone(
    status: TaskStatus, instance_state: str | None, room: bool
) -> None:
    capacity = Capacity()
    capacity.take_tasks([_task(status, instance_state)], {"c1": CLUSTER})
    assert capacity.fits(CLUSTER, "H100", IT) is room
