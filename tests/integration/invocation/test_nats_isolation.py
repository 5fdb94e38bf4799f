"""A hostile worker on the nats transport: it holds a real session of its own function and tries to
read and answer the requests of another function, in another account. Nothing gets through: every
subject of the other's is a permissions violation, forged frames are refused, and the other's
callers get their real answers.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import anyio
import nats.errors
import pytest
from grpclib.client import Channel, Stream
from grpclib.const import Cardinality, Status
from grpclib.exceptions import GRPCError
from nats.aio.client import Client as NatsClient
from nats.aio.subscription import Subscription

from nvcf_mono.auth.secret import KEYRING
from nvcf_mono.auth.tokens import TokenSigner, mint_worker_token
from nvcf_mono.bus.codec import TypedKV
from nvcf_mono.bus.errors import RequestTimeout
from nvcf_mono.contracts import buckets, subjects
from nvcf_mono.contracts.buckets import StoredResult
from nvcf_mono.contracts.frames import Frame, Request
from nvcf_mono.planes.invocation import workers
from nvcf_mono.planes.invocation.responses import Capabilities
from nvcf_mono.proto.gen.nvcf.worker.v1 import (
    BodyChunk,
    BodyRequest,
    ConnectRequest,
    ConnectResponse,
    WorkerHello,
    WorkerMessage,
)
from nvcf_mono.proto.serve_wire import NodeEnvelope, WorkerEnvelope
from nvcf_mono.structure import evolve
from nvcf_mono.testing.nats_server import raw_client
from nvcf_mono.testing.platform import wait_for
from nvcf_mono.testing.running import agent
from nvcf_mono.worker.agent import SERVICE
from tests.integration.control.test_sharing import account_key, add_account

from .conftest import ECHO_FUNCTION, Platform, deployed, launching_agent, platform

# Bodies past 1 KiB go through the object store, so the body fetch is attacked too.
NATS = {"plugins.invocation.transport": "nats", "plugins.invocation.inline_body_limit": "1024"}
ACCOUNT_B = "acct-b"


async def connect_once(
    p: Platform, fid: str, vid: str, nca: str, *, transport: str = "nats", max_concurrency: int = 1
) -> ConnectResponse:
    """A real session of the version: what any of its instances gets with its worker token."""
    signer = TokenSigner(p.host.services.get(KEYRING).token_key)
    token = mint_worker_token(signer, nca_id=nca, function_id=fid, function_version_id=vid, request_id="r")
    host, _, port = p.host.endpoints.grpc_address.rpartition(":")
    async with Channel(host, int(port)) as channel:
        with anyio.fail_after(10):
            async with channel.request(
                f"{SERVICE}/ConnectOnce", Cardinality.UNARY_UNARY, ConnectRequest, ConnectResponse
            ) as stream:
                request = ConnectRequest(
                    worker_token=token, instance_id="hostile", max_concurrency=max_concurrency, transports=[transport]
                )
                await stream.send_message(request, end=True)
                reply = await stream.recv_message()
    assert reply is not None and reply.transport == transport, reply
    if transport == "nats":
        assert reply.nats_inbox_prefix.startswith(subjects.WORKER_INBOX_ROOT + ".")
    return reply


@asynccontextmanager
async def on_nats(session: ConnectResponse, errors: list[str]) -> AsyncIterator[NatsClient]:
    """The session's NATS connection, as the worker makes it (its token and inbox prefix)."""

    async def on_error(err: Exception) -> None:
        errors.append(str(err))

    nc = await raw_client(
        session.nats_url,
        token=session.nats_token,
        inbox_prefix=session.nats_inbox_prefix,
        error_cb=on_error,
        allow_reconnect=False,
        max_reconnect_attempts=0,
        connect_timeout=5,
    )
    try:
        yield nc
    finally:
        await nc.close()


def violations(errors: list[str], kind: str, subject: str) -> int:
    """Permission violations nats-py reported for a ``subscription`` or ``publish`` to ``subject``
    (it lowercases the server's text)."""
    wanted = f'permissions violation for {kind} to "{subject.lower()}"'
    return sum(wanted in e.lower() for e in errors)


FORGED = json.dumps({"message": "forged"}).encode()


def forged_frame(request_id: str, capability: str = "") -> bytes:
    """A whole response in one frame."""
    headers = (("Content-Type", "application/json"),)
    frame = Frame(request_id=request_id, seq=0, status=200, headers=headers, body=FORGED, end=True)
    return evolve(frame, capability=capability).encode()


async def received(sub: Subscription) -> list[bytes]:
    """What a subscription holds now."""
    out = []
    while True:
        try:
            out.append((await sub.next_msg(timeout=0.05)).data)
        except nats.errors.TimeoutError:
            return out


async def fetch_body(p: Platform, session: ConnectResponse, request: Request, capability: str) -> bytes:
    host, _, port = p.host.endpoints.grpc_address.rpartition(":")
    async with Channel(host, int(port)) as channel:
        with anyio.fail_after(10):
            async with channel.request(f"{SERVICE}/FetchBody", Cardinality.UNARY_STREAM, BodyRequest, BodyChunk) as s:
                await s.send_message(
                    BodyRequest(
                        session_token=session.session_token,
                        request_id=request.request_id,
                        body_object=request.body_object or "",
                        capability=capability,
                    ),
                    end=True,
                )
                return b"".join([chunk.data async for chunk in s])


@asynccontextmanager
async def serve_session(
    p: Platform, session: ConnectResponse, instance_id: str = "hostile"
) -> AsyncIterator[Stream[WorkerEnvelope, NodeEnvelope]]:
    """The session's Serve stream, started with its hello, as the worker opens it."""
    host, _, port = p.host.endpoints.grpc_address.rpartition(":")
    async with (
        Channel(host, int(port)) as channel,
        channel.request(f"{SERVICE}/Serve", Cardinality.STREAM_STREAM, WorkerEnvelope, NodeEnvelope) as s,
    ):
        hello = WorkerHello(session_token=session.session_token, instance_id=instance_id, max_concurrency=1)
        await s.send_message(WorkerEnvelope(message=WorkerMessage(hello=hello)))
        with anyio.fail_after(10):
            assert await s.recv_message() is not None  # the session started
        yield s


@pytest.mark.slow
async def test_a_worker_reaches_nothing_of_another_functions_requests(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with platform(tmp_path, **NATS) as p, launching_agent(p, tmp_path / "instances"):
        await add_account(p, ACCOUNT_B)
        b = p.api(await account_key(p, ACCOUNT_B))
        fid1, vid1 = await deployed(p.admin)
        fid2, vid2 = await deployed(b)
        capabilities = Capabilities.of_keyring(p.host.services.get(KEYRING))
        mine = await connect_once(p, fid1, vid1, "nvcf-default")
        theirs = await connect_once(p, fid2, vid2, ACCOUNT_B)  # another session, of the other function
        errors: list[str] = []
        async with on_nats(mine, errors) as nc:
            # What the grant allows: its own inbox, its cancels, and its own durable.
            own = await nc.subscribe(f"{mine.nats_inbox_prefix}.>")
            await nc.subscribe(mine.cancel_subject)
            js = nc.jetstream()
            info = await js.consumer_info(mine.stream, mine.durable)  # a request/reply under its inbox
            assert info.name == mine.durable
            await nc.flush(timeout=5)
            assert errors == []

            # Everything the other function's traffic uses, and the platform's, is out of reach.
            their_inbox = theirs.nats_inbox_prefix
            subscribe = [
                ">",
                "_INBOX.>",
                f"{subjects.WORKER_INBOX_ROOT}.>",
                f"{their_inbox}.>",
                "nvcf.resp.>",
                subjects.RESPONSE_SUBJECTS,
                subjects.INPUT_SUBJECTS,
                subjects.request_filter("ncp", vid2),
                "rq.>",
                theirs.cancel_subject,
                f"$JS.ACK.{theirs.stream}.>",
                "$JS.API.>",
                "$KV.>",
                "$O.>",
                subjects.SECRETS_FETCH,
                subjects.ICMS_ALL,
                "nvcf.agent.>",
                subjects.TASK_CALLS,
                "$SYS.>",
                "Create.NVCA.>",
            ]
            publish = [
                f"$JS.API.CONSUMER.MSG.NEXT.{theirs.stream}.{theirs.durable}",
                f"$JS.API.CONSUMER.INFO.{theirs.stream}.{theirs.durable}",
                f"$JS.API.STREAM.INFO.{theirs.stream}",
                f"$JS.API.STREAM.MSG.GET.{theirs.stream}",
                f"$JS.API.DIRECT.GET.{theirs.stream}",
                f"$JS.API.STREAM.PURGE.{theirs.stream}",
                f"$JS.API.CONSUMER.CREATE.{mine.stream}",  # not even another consumer on its own stream
                f"$JS.API.CONSUMER.DELETE.{mine.stream}.{mine.durable}",
                "$JS.API.STREAM.LIST",
                "$JS.API.INFO",
                f"$JS.ACK.{theirs.stream}.{theirs.durable}.1.1.1.1.1",
                f"$KV.{buckets.SECRETS.name}.x",
                f"$O.{buckets.PAYLOADS.name}.M.x",
                subjects.SECRETS_FETCH,
                subjects.icms_subject("register", "c"),
                subjects.agent_subject("instances", "c"),
                subjects.task_subject("result"),
                subjects.request_subject("ncp", vid2, str(uuid.uuid4())),
                theirs.cancel_subject,
                f"{their_inbox}.x",
                "_INBOX.x",
                "nvcf.resp.node.request",  # the response subject without a capability
                "$SYS.REQ.SERVER.PING",
            ]
            denied = [await nc.subscribe(s) for s in subscribe]
            for subject in publish:
                await nc.publish(subject, b"x")
            await nc.flush(timeout=5)

            async def all_refused() -> bool:
                return all(violations(errors, "subscription", s) for s in subscribe) and all(
                    violations(errors, "publish", s) for s in publish
                )

            await wait_for(all_refused, timeout=15, what=f"a permissions violation for every subject: {errors}")

            # Live traffic of the other function: watched by the test (with the platform's own
            # credentials) to know each request the moment it is queued, and attacked by the worker.
            forged_answers: list[bytes] = []
            async with p.bus.subscribe(subjects.request_filter("ncp", vid2)) as queued:

                async def call(n: int, out: dict[int, object]) -> None:
                    secret = f"secret-of-b-{n}-" + "x" * 1100
                    reply = await b.post(f"/v2/nvcf/pexec/functions/{fid2}", {"message": secret, "delay": 1.0})
                    assert reply.status == 200, reply.body
                    out[n] = reply.json["message"] == secret

                answers: dict[int, object] = {}
                observed: list[Request] = []
                for n in range(3):
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(call, n, answers)
                        request = Request.decode((await queued.next(timeout=15)).data)
                        rid = request.request_id
                        observed.append(request)
                        assert request.body_object is not None  # the body waits in the object store
                        inbox = request.reply.split(".")[2]
                        # Frames on the request's own subject, with a made-up capability and with the
                        # capability the same request id would have in the attacker's version.
                        for capability in ("A" * 22, capabilities.of(vid1, rid)):
                            subject = subjects.response_subject(inbox, rid, capability)
                            forged_answers.append((await nc.request(subject, forged_frame(rid), timeout=5)).data)
                        # The body in the object store: not without the request's capability, and not
                        # with it either from a session of another version (a stolen capability).
                        stolen = subjects.response_capability(request.reply)
                        for capability in ("", "A" * 22, stolen):
                            with pytest.raises(GRPCError) as refused:
                                await fetch_body(p, mine, request, capability)
                            assert refused.value.status == Status.PERMISSION_DENIED
                        assert b"secret-of-b" in await fetch_body(p, theirs, request, stolen)  # its own version's may
                assert answers == {0: True, 1: True, 2: True}  # the real answers, not "forged"
            assert forged_answers == [b"gone"] * 6
            refused = [r for r in caplog.records if "without its capability" in r.getMessage()]
            assert len(refused) == 5, [r.getMessage() for r in refused]  # six forgeries: the log keeps a few

            # Nothing of theirs ever reached any subscription the worker holds.
            await nc.flush(timeout=5)
            for sub in denied:
                assert await received(sub) == [], f"{sub.subject} received messages"
            assert not any(b"secret-of-b" in data for data in await received(own))

        await forged_orphans_are_not_kept(p, mine, capabilities, vid1, victims=[r.request_id for r in observed])


async def results(p: Platform, request_id: str) -> StoredResult | None:
    found = await TypedKV(p.bus.kv(buckets.RESULTS.name), buckets.RESULT).get(request_id)
    return None if found is None else found.value


async def forged_orphans_are_not_kept(
    p: Platform, mine: ConnectResponse, capabilities: Capabilities, vid: str, *, victims: list[str]
) -> None:
    """Frames for the other function's requests up the session's gRPC stream, as a worker whose
    client's node went away sends them: none is kept as their result."""
    control = str(uuid.uuid4())
    async with serve_session(p, mine) as s:
        # No capability, a made-up one, and the one the request would have in another version.
        wrong = ("", "A" * 22, capabilities.of(str(uuid.uuid4()), victims[2]))
        for rid, capability in zip(victims, wrong, strict=True):
            await s.send_message(WorkerEnvelope(frame=forged_frame(rid, capability)))
        # The same path with the capability of a request of its own version is kept.
        await s.send_message(WorkerEnvelope(frame=forged_frame(control, capabilities.of(vid, control))))

        async def kept() -> StoredResult | None:
            return await results(p, control)

        stored = await wait_for(kept, timeout=10, what="the orphaned response of its own request")
        assert base64.b64decode(stored.body) == FORGED
        for rid in victims:
            assert await results(p, rid) is None, "a forged response was kept as another request's result"
        await s.end()


@pytest.mark.slow
async def test_a_response_whose_node_went_away_is_kept_with_its_capability_only(tmp_path: Path) -> None:
    """A real worker answers requests whose node is gone: the frames go up its gRPC stream."""
    async with platform(tmp_path, **NATS) as p, launching_agent(p, tmp_path / "instances"):
        fid, vid = await deployed(p.admin)
        capabilities = Capabilities.of_keyring(p.host.services.get(KEYRING))
        stream = p.bus.stream(subjects.request_stream("ncp", vid))
        gone = f"gone-node-{uuid.uuid4().hex[:8]}"  # an invocation node nobody serves any more

        async def queue(capability_of: str | None) -> str:
            rid = str(uuid.uuid4())
            now = int(time.time() * 1000)
            request = Request(
                request_id=rid,
                nca_id="nvcf-default",
                function_id=fid,
                function_version_id=vid,
                method="POST",
                path="/echo",
                headers=(("Content-Type", "application/json"),),
                reply=subjects.response_subject(gone, rid, capabilities.of(capability_of or vid, rid)),
                time_ms=now,
                deadline_ms=now + 60_000,
                poll_seconds=1,
                body=json.dumps({"message": rid}).encode(),
            )
            await stream.publish(subjects.request_subject("ncp", vid, rid), request.encode(), msg_id=rid)
            return rid

        # One carries the capability another version would have (a worker's frames for it are not
        # kept), the next its own; the instance serves them in turn.
        foreign = await queue(str(uuid.uuid4()))
        own = await queue(None)

        async def kept() -> StoredResult | None:
            return await results(p, own)

        stored = await wait_for(kept, timeout=30, what="the result kept by the worker's node")
        assert stored.status == 200
        assert json.loads(base64.b64decode(stored.body))["message"] == own
        assert await results(p, foreign) is None


@pytest.mark.slow
async def test_a_session_cannot_make_its_node_publish_to_other_subjects(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker on the nats transport tells its node which deliveries it holds (their ack subjects);
    when its session ends the node naks them, with its own rights. A hostile session naming other
    subjects (a KV key, another version's acks, any subject) gets none of them published, and its
    flood of claims does not become a flood of log lines."""
    async with platform(tmp_path, **NATS) as p, agent(p.bus):  # a scripted agent: no instance needed
        fid, vid = await deployed(p.admin, {**ECHO_FUNCTION, "name": "held-probe"})
        mine = await connect_once(p, fid, vid, "nvcf-default")
        tag = uuid.uuid4().hex
        own = f"$JS.ACK.{mine.stream}.{mine.durable}.1.99999.99999.1.0"  # its own version's: naked
        foreign = [
            f"$KV.nvcf_functions.{tag}",
            f"$JS.ACK.{mine.stream}X.{mine.durable}.1.2.3.4.5",
            f"$JS.ACK.{mine.stream}.{mine.durable}.1.2.3.4",  # one number short
            f"$JS.ACK.{mine.stream}.{mine.durable}.1.2.3.4.5.6",
            f"probe.{tag}",
        ]
        async with AsyncExitStack() as stack:
            subs = [await stack.enter_async_context(p.bus.subscribe(subject)) for subject in [own, *foreign]]
            every_ack = await stack.enter_async_context(p.bus.subscribe(f"$JS.ACK.{mine.stream}.{mine.durable}.>"))
            async with serve_session(p, mine) as s:
                for n, subject in enumerate([own, *foreign]):
                    await s.send_message(WorkerEnvelope(held=(f"r{n}", subject)))
                # Past twice its slots, more claims are not remembered (nor naked).
                for n in range(10):
                    await s.send_message(WorkerEnvelope(held=(f"flood{n}", own.replace("99999.99999", f"{n}.{n}"))))
                for n in range(300):
                    await s.send_message(WorkerEnvelope(held=(f"kv{n}", f"$KV.nvcf_functions.{tag}{n}")))
                await s.end()
            naked = await subs[0].next(timeout=10)
            assert naked.data == b"-NAK"
            await anyio.sleep(0.5)
            for sub, subject in zip(subs[1:], foreign, strict=True):
                with pytest.raises(RequestTimeout):
                    got = await sub.next(timeout=0.05)
                    raise AssertionError(f"the node published {got.data!r} to {subject}")
            # Its own delivery and the first flood claim (two slots' worth), nothing more.
            acks = [(await every_ack.next(timeout=1)).subject for _ in range(2)]
            assert sorted(acks) == sorted([own, own.replace("99999.99999", "0.0")]), acks
            with pytest.raises(RequestTimeout):
                await every_ack.next(timeout=0.2)
        refusals = [r for r in caplog.records if "says it holds" in r.getMessage()]
        assert len(refusals) == 5, [r.getMessage() for r in refusals]  # 313 refused; the log has a few


@pytest.mark.slow
async def test_orphaned_responses_are_kept_within_a_memory_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Frames a session sends up its gRPC stream for a caller whose node went away wait in the node's
    memory until their last frame; past the session's budget the response is stored as a 502 instead,
    its later frames are dropped, and the budget is free again for the next."""
    monkeypatch.setattr(workers, "ORPHANED_BYTES", 1500)
    async with platform(tmp_path, **NATS) as p, agent(p.bus):
        fid, vid = await deployed(p.admin, {**ECHO_FUNCTION, "name": "orphan-budget"})
        mine = await connect_once(p, fid, vid, "nvcf-default")
        capabilities = Capabilities.of_keyring(p.host.services.get(KEYRING))
        big, small = str(uuid.uuid4()), str(uuid.uuid4())
        async with serve_session(p, mine, "streamer") as s:

            def frame(rid: str, seq: int, body: bytes, *, last: bool = False) -> WorkerEnvelope:
                piece = Frame(request_id=rid, seq=seq, status=200 if seq == 0 else None, body=body, end=last)
                return WorkerEnvelope(frame=evolve(piece, capability=capabilities.of(vid, rid)).encode())

            for seq in range(5):  # 3,000 bytes of a response that never fits
                await s.send_message(frame(big, seq, b"x" * 600))
            await s.send_message(frame(big, 5, b"end", last=True))
            await s.send_message(frame(small, 0, b"fits", last=True))

            async def stored(rid: str) -> StoredResult | None:
                return await results(p, rid)

            kept = await wait_for(lambda: stored(small), timeout=10, what="the small response")
            assert base64.b64decode(kept.body) == b"fits"
            refused = await wait_for(lambda: stored(big), timeout=10, what="the large response's 502")
            assert refused.status == 502 and b"larger than" in base64.b64decode(refused.body), refused
            await s.end()
