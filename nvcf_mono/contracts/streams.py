"""JetStream streams and durable consumers that cross plane boundaries; every creator uses these."""

from __future__ import annotations

from nvcf_mono.bus.api import Bus, ConsumerSpec, Discard, Retention, StreamSpec, StreamState
from nvcf_mono.contracts import subjects

#: Creation messages wait here until the addressed cluster's agent takes them (reference §1: 96 h).
CREATE_STREAM = StreamSpec(
    name=subjects.CREATE_STREAM,
    subjects=("Create.NVCA.>",),
    description="Instance creation messages for cluster agents (Create.NVCA.<kind>.<cluster>.<gpu>.<type>).",
    retention=Retention.WORK_QUEUE,
    max_msgs=1_000_000,
    max_age=96 * 3600.0,
    # The control plane republishes a placement it is unsure was sent; the request id dedupes it.
    duplicate_window=600.0,
)

TERMINATE_STREAM = StreamSpec(
    name=subjects.TERMINATE_STREAM,
    subjects=("Terminate.NVCA.>",),
    description="Instance termination messages for cluster agents (Terminate.NVCA.<cluster>).",
    retention=Retention.WORK_QUEUE,
    max_msgs=1_000_000,
    max_age=96 * 3600.0,
    duplicate_window=600.0,
)


def create_consumer(cluster_id: str) -> ConsumerSpec:
    """One cluster's durable on the creation stream (ack wait 360 s, as NVCA)."""
    return ConsumerSpec(
        durable=subjects.agent_durable(subjects.CREATE_STREAM, cluster_id),
        filter_subjects=(subjects.create_filter(cluster_id),),
        description=f"creation messages of cluster {cluster_id}",
        ack_wait=360.0,
    )


def terminate_consumer(cluster_id: str) -> ConsumerSpec:
    """One cluster's durable on the termination stream (ack wait 30 s, as NVCA)."""
    return ConsumerSpec(
        durable=subjects.agent_durable(subjects.TERMINATE_STREAM, cluster_id),
        filter_subjects=(subjects.terminate_subject(cluster_id),),
        description=f"termination messages of cluster {cluster_id}",
        ack_wait=30.0,
    )


def request_stream(
    region: str, function_version_id: str, *, max_msgs: int, max_msg_size: int, duplicate_window: float
) -> StreamSpec:
    """The durable request buffer of one function version (work queue; a full queue refuses: 429).

    No ``max_bytes``: JetStream reserves a stream's byte limit out of the server's whole store when
    the stream is made, so a byte limit per version made the store's cost grow with the number of
    versions ever deployed (the 11th version of 1 GiB filled a 10 GiB store). Messages are bounded
    (``max_msg_size``: larger bodies go to the object store), the count by ``max_msgs``, and the
    invocation plane enforces each version's byte quota itself.

    ``duplicate_window``: how long JetStream remembers a request id, so that a publish retried after an
    unanswered first attempt is not stored twice. Only as long as such retries go on: the server keeps
    every id of the window in memory, so its memory grows with the request rate times the window.
    """
    return StreamSpec(
        name=subjects.request_stream(region, function_version_id),
        subjects=(subjects.request_filter(region, function_version_id),),
        description=f"invocation requests of function version {function_version_id} in {region}",
        retention=Retention.WORK_QUEUE,
        max_msgs=max_msgs,
        max_msg_size=max_msg_size,
        discard=Discard.NEW,
        # One message per request id: a repeated publish is a duplicate, not a second request.
        max_msgs_per_subject=1,
        discard_new_per_subject=True,
        duplicate_window=duplicate_window,
    )


def request_consumer(region: str, function_version_id: str, *, ack_wait: float) -> ConsumerSpec:
    """The durable the invocation plane pulls for the version's workers (reference: ack wait 30 s).

    No JetStream max_deliver (the reference's): a request JetStream stopped delivering would never
    be answered. The platform counts failures itself (``max_deliver`` of the invocation plane).
    """
    return ConsumerSpec(
        durable=subjects.worker_durable(region, function_version_id),
        filter_subjects=(subjects.request_filter(region, function_version_id),),
        description=f"workers of function version {function_version_id}",
        ack_wait=ack_wait,
        max_deliver=-1,
        max_ack_pending=100_000,
        max_waiting=4096,
    )


async def queues(bus: Bus, region: str) -> dict[str, StreamState]:
    """Every request queue of ``region`` by version id (requests waiting or being served).

    A request stream is a work queue: a message stays until its request is settled, so the stream's
    count is what its consumer has pending plus what instances hold. One call per 256 versions, where
    asking each version's consumer costs a call per version.
    """
    found = {}
    for name, state in (await bus.stream_states(subjects.request_streams_filter(region))).items():
        version_id = subjects.version_of_request_stream(region, name)
        if version_id is not None:
            found[version_id] = state
    return found


async def queue_depths(bus: Bus, region: str) -> dict[str, int]:
    """Requests queued per version id, for every version of ``region`` with a queue."""
    return {version_id: state.messages for version_id, state in (await queues(bus, region)).items()}
