"""NVCA's request state machine over the instances' states."""

from __future__ import annotations

from nvcf_mono.contracts import states
from nvcf_mono.contracts.agent import AgentInstance, AgentRequest, RequestStatus
from nvcf_mono.contracts.messages import Action, CreationMessage, LaunchSpecification
from nvcf_mono.planes.compute.requests import instance_ids, new_request, next_status, refused
from nvcf_mono.structure import evolve

NOW = "2026-01-01T00:00:00.000Z"


def message(count: int = 2) -> CreationMessage:
    return CreationMessage(
        request_id="6f1c2d4e-0000-4000-8000-000000000001",
        nca_id="acct",
        action=Action.REQUEST_INSTANCES,
        cluster_id="c",
        instance_count=count,
        instance_type_name="ON-PREM.GPU.H100_1x",
        instance_type_value="ON-PREM.GPU.H100",
        gpu_type="H100",
        requested_gpu_count=1,
        message_batch_id="b",
        created_at=NOW,
        launch_specification=LaunchSpecification(gpu_name="H100"),
    )


def with_states(req: AgentRequest, *pairs: tuple[str, str | None]) -> AgentRequest:
    out = []
    for inst, (state, reported) in zip(req.instances, pairs, strict=True):
        status = states.FULFILLED if state == states.RUNNING else states.PENDING_FULFILLMENT
        if state in states.GONE_STATES:
            status = states.TERMINATED_BY_SERVICE
        out.append(evolve(inst, state=state, status=status, launched_at=NOW, reported=reported and f"{status}|{state}"))
    return evolve(req, instances=tuple(out), status=RequestStatus.IN_PROGRESS)


def test_instance_ids_are_nvca_pod_names() -> None:
    assert instance_ids("r", 3) == ["0-sr-r", "1-sr-r", "2-sr-r"]
    assert len(instance_ids("x" * 80, 1)[0]) == 63


def test_a_new_request_waits_for_the_control_plane_then_progresses() -> None:
    req = new_request(message(), "c", NOW)
    assert req.status is RequestStatus.RECEIVED and [i.instance_id for i in req.instances] == instance_ids(
        req.request_id, 2
    )
    assert next_status(req) is RequestStatus.RECEIVED
    pending = evolve(req, status=RequestStatus.PENDING)
    assert next_status(pending) is RequestStatus.PENDING
    one_launched = evolve(pending, instances=(evolve(req.instances[0], launched_at=NOW), req.instances[1]))
    assert next_status(one_launched) is RequestStatus.IN_PROGRESS


def test_aggregation_and_acknowledgement() -> None:
    req = new_request(message(), "c", NOW)
    assert next_status(with_states(req, (states.STARTING, None), (states.RUNNING, None))) is (
        RequestStatus.INSTANCES_IN_PROGRESS
    )
    running = with_states(req, (states.RUNNING, None), (states.RUNNING, "x"))
    assert next_status(running) is RequestStatus.COMPLETED
    reported = with_states(req, (states.RUNNING, "yes"), (states.RUNNING, "yes"))
    assert next_status(reported) is RequestStatus.COMPLETION_ACKNOWLEDGED
    failed = with_states(req, (states.CONTAINER_RESTART_LOOP, None), (states.RUNNING, "yes"))
    assert next_status(failed) is RequestStatus.FAILED
    acked = with_states(req, (states.CONTAINER_RESTART_LOOP, "yes"), (states.RUNNING, "yes"))
    assert next_status(acked) is RequestStatus.FAILURE_ACKNOWLEDGED
    assert not acked.finished
    done = with_states(req, (states.TERMINATED, "yes"), (states.CONTAINER_RESTART_LOOP, "yes"))
    assert done.finished


def test_a_refused_request_is_finished_without_reports() -> None:
    req = refused(new_request(message(1), "c", NOW), "not wanted", NOW)
    assert req.status is RequestStatus.FAILURE_ACKNOWLEDGED and req.finished and req.error == "not wanted"
    assert isinstance(req.instances[0], AgentInstance) and req.instances[0].gone
