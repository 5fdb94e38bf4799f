"""Queue depth of function versions and the position of a queued request, read from the request streams."""

from __future__ import annotations

import uuid
from contextlib import AsyncExitStack
from pathlib import Path

import anyio

from nvcf_mono.bus.api import Delivery, Stream
from nvcf_mono.contracts import buckets, streams, subjects
from nvcf_mono.models.common import now_iso
from nvcf_mono.structure import evolve
from nvcf_mono.testing.running import other_account_key

from .conftest import CONTAINER_FUNCTION, Platform, platform

QUEUES = "/v2/nvcf/queues"


async def new_function(p: Platform) -> tuple[str, str]:
    created = await p.admin.post("/v2/nvcf/functions", CONTAINER_FUNCTION)
    assert created.status == 200, created.body
    return created.json["function"]["id"], created.json["function"]["versionId"]


def region_of(p: Platform) -> str:
    return p.host.settings.node.region


async def request_stream(p: Platform, version_id: str, *, consumer: bool = True) -> Stream:
    """The version's request stream and workers' durable, as the invocation plane ensures them."""
    region = region_of(p)
    await p.bus.ensure_stream(
        streams.request_stream(region, version_id, max_msgs=10_000, max_msg_size=1024 * 1024, duplicate_window=30.0)
    )
    stream = p.bus.stream(subjects.request_stream(region, version_id))
    if consumer:
        await stream.ensure_consumer(streams.request_consumer(region, version_id, ack_wait=30.0))
    return stream


async def enqueue(p: Platform, stream: Stream, fid: str, vid: str, count: int, *, record: bool = True) -> list[str]:
    """Publish ``count`` requests and record them as queued (what the invocation plane does)."""
    region = region_of(p)
    records = buckets.typed(await p.bus.ensure_bucket(buckets.REQUESTS), buckets.REQUEST)
    ids = []
    for _ in range(count):
        rid = str(uuid.uuid4())
        await stream.publish(subjects.request_subject(region, vid, rid), b"request")
        if record:
            await records.put(
                rid,
                buckets.RequestRecord(
                    request_id=rid,
                    function_id=fid,
                    function_version_id=vid,
                    nca_id="nvcf-default",
                    region=region,
                    state="queued",
                    created_at=now_iso(),
                ),
            )
        ids.append(rid)
    return ids


async def set_state(p: Platform, request_id: str, state: str) -> None:
    records = buckets.typed(p.bus.kv(buckets.REQUESTS.name), buckets.REQUEST)
    current = await records.get(request_id)
    assert current is not None
    await records.put(request_id, evolve(current.value, state=state))


async def position(p: Platform, request_id: str) -> int | None:
    reply = await p.key.get(f"{QUEUES}/{request_id}/position")
    if reply.status == 404:
        return None
    assert reply.status == 200, reply.body
    return int(reply.json["positionInQueue"])


async def depth(p: Platform, fid: str, vid: str) -> int:
    reply = await p.key.get(f"{QUEUES}/functions/{fid}/versions/{vid}")
    assert reply.status == 200, reply.body
    assert reply.json["functionId"] == fid
    [queue] = reply.json["queues"]
    assert queue["functionVersionId"] == vid
    return int(queue["queueDepth"])


async def take(stream: Stream, durable: str, count: int, stack: AsyncExitStack) -> list[Delivery]:
    """``count`` deliveries held (not settled) by a worker."""
    consumer = await stack.enter_async_context(stream.consume(durable, batch=count, max_inflight=count))
    out: list[Delivery] = []
    with anyio.fail_after(10):
        async for delivery in consumer:
            out.append(delivery)
            if len(out) == count:
                break
    return out


async def test_depth_and_positions_follow_the_request_stream(tmp_path: Path) -> None:
    async with platform(tmp_path) as p, AsyncExitStack() as stack:
        fid, vid = await new_function(p)
        # No stream yet: nothing is waiting.
        whole = await p.key.get(f"{QUEUES}/functions/{fid}")
        assert whole.status == 200, whole.body
        assert whole.json == {
            "functionId": fid,
            "queues": [
                {"functionVersionId": vid, "functionName": "echo", "functionStatus": "INACTIVE", "queueDepth": 0}
            ],
        }
        stream = await request_stream(p, vid)
        ids = await enqueue(p, stream, fid, vid, 6)
        assert await depth(p, fid, vid) == 6
        assert [await position(p, rid) for rid in ids] == [1, 2, 3, 4, 5, 6]
        reply = await p.key.get(f"{QUEUES}/{ids[2]}/position")
        assert reply.json == {"functionId": fid, "functionVersionId": vid, "positionInQueue": 3}

        # A worker takes two: they are no longer queued, the rest move up.
        durable = subjects.worker_durable(region_of(p), vid)
        held = await take(stream, durable, 2, stack)
        assert [d.subject.rsplit(".", 1)[1] for d in held] == ids[:2]
        assert await depth(p, fid, vid) == 4
        assert await position(p, ids[0]) is None and await position(p, ids[1]) is None
        assert [await position(p, rid) for rid in ids[2:]] == [1, 2, 3, 4]
        for delivery in held:
            await delivery.ack_sync()
        assert [await position(p, rid) for rid in ids[2:]] == [1, 2, 3, 4]

        # A request cancelled from the middle of the queue (its subject purged) no longer counts.
        await stream.purge(subject=subjects.request_subject(region_of(p), vid, ids[3]))
        assert await depth(p, fid, vid) == 3
        assert await position(p, ids[3]) is None
        assert [await position(p, rid) for rid in (ids[2], ids[4], ids[5])] == [1, 2, 3]

        # The record says it is running (the invocation plane moved it on): not queued.
        await set_state(p, ids[5], "running")
        assert await position(p, ids[5]) is None
        # Unknown ids, malformed ids.
        assert await position(p, str(uuid.uuid4())) is None
        assert (await p.key.get(f"{QUEUES}/not-a-request/position")).status == 404


async def test_positions_are_capped_at_1000(tmp_path: Path) -> None:
    async with platform(tmp_path) as p:
        fid, vid = await new_function(p)
        stream = await request_stream(p, vid)
        await enqueue(p, stream, fid, vid, 1000, record=False)
        [near, last] = await enqueue(p, stream, fid, vid, 2)
        assert await position(p, near) == 1000
        assert await position(p, last) == 1000
        assert await depth(p, fid, vid) == 1002


async def test_a_stream_without_a_worker_durable_counts_every_stored_request(tmp_path: Path) -> None:
    async with platform(tmp_path) as p:
        fid, first = await new_function(p)
        created = await p.admin.post(f"/v2/nvcf/functions/{fid}/versions", CONTAINER_FUNCTION)
        second = created.json["function"]["versionId"]
        stream = await request_stream(p, second, consumer=False)
        ids = await enqueue(p, stream, fid, second, 3)
        whole = await p.key.get(f"{QUEUES}/functions/{fid}")
        assert {q["functionVersionId"]: q["queueDepth"] for q in whole.json["queues"]} == {first: 0, second: 3}
        assert [await position(p, rid) for rid in ids] == [1, 2, 3]
        # Why they wait: the version is not deployed, so no instance runs or starts for it.
        reasons = {q["functionVersionId"]: q.get("waitReason") for q in whole.json["queues"]}
        assert reasons == {first: None, second: "cold_starting"}


async def test_only_accounts_that_see_the_function_see_its_queues(tmp_path: Path) -> None:
    async with platform(tmp_path) as p:
        fid, vid = await new_function(p)
        stream = await request_stream(p, vid)
        [rid] = await enqueue(p, stream, fid, vid, 1)
        other = p.api(await other_account_key(p, "acct-two"))
        assert (await other.get(f"{QUEUES}/functions/{fid}")).status == 404
        assert (await other.get(f"{QUEUES}/functions/{fid}/versions/{vid}")).status == 404
        assert (await other.get(f"{QUEUES}/{rid}/position")).status == 404
        assert (await p.key.get(f"{QUEUES}/functions/{uuid.uuid4()}")).status == 404
        assert (await p.key.get(f"{QUEUES}/functions/{fid}/versions/{uuid.uuid4()}")).status == 404
        assert (await p.task_key.get(f"{QUEUES}/functions/{fid}")).status == 403

        shared = await p.admin.post(
            f"/v2/nvcf/authorizations/functions/{fid}", {"authorizedParties": [{"ncaId": "acct-two"}]}
        )
        assert shared.status == 200, shared.body
        seen = await other.get(f"{QUEUES}/functions/{fid}/versions/{vid}")
        assert seen.status == 200 and seen.json["queues"][0]["queueDepth"] == 1
        assert (await other.get(f"{QUEUES}/{rid}/position")).json["positionInQueue"] == 1
        # A super admin reads any account's queues through the cross-account twin.
        twin = await p.admin.get(f"/v2/nvcf/accounts/nvcf-default/queues/functions/{fid}")
        assert twin.status == 200 and twin.json["queues"][0]["queueDepth"] == 1


async def test_count_stored_skips_interior_deletes(tmp_path: Path) -> None:
    async with platform(tmp_path) as p:
        vid = str(uuid.uuid4())
        stream = await request_stream(p, vid, consumer=False)
        seqs = [
            (await stream.publish(subjects.request_subject(region_of(p), vid, str(uuid.uuid4())))).seq
            for _ in range(10)
        ]
        assert await stream.delete_msg(seqs[2]) and await stream.delete_msg(seqs[4])
        assert await stream.delete_msg(seqs[0])
        assert await stream.count_stored(seqs[0], seqs[-1]) == 7
        assert await stream.count_stored(seqs[3], seqs[5]) == 2
        assert await stream.count_stored(seqs[4], seqs[4]) == 0
        assert await stream.count_stored(seqs[-1] + 1, seqs[-1] + 50) == 0
        assert await stream.count_stored(seqs[5], seqs[4]) == 0
