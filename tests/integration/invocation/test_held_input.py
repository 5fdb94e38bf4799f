"""One account's request input held in an invocation node's memory is bounded; other accounts call on.

Each request's body is bounded on its own (``max_request_body``), but a node holds every call's input
while it reads it (and a live gRPC call's until its function has read it), so a tenant with many calls
open could take the memory every account's calls need. These are the attacks: many slow uploads, a
live call that never ends, a gRPC message declaring 4 GiB, many calls and status polls held open. The
instances are a scripted agent's (ACTIVE, nothing serves): what is tested happens before any instance
is involved.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, cast

import anyio
import pytest
from grpclib.client import Channel
from grpclib.const import Cardinality, Status
from grpclib.encoding.proto import ProtoCodec
from grpclib.exceptions import GRPCError

from nvcf_mono.auth import scopes
from nvcf_mono.grpc.raw import RawMessage
from nvcf_mono.planes.invocation.held_input import CALLS_SETTING, SETTING, HeldInput
from nvcf_mono.proto.gen.examples.echo.v1 import EchoRequest, EchoResponse
from nvcf_mono.testing.platform import wait_for
from nvcf_mono.testing.running import Platform, agent, deployed, other_account_key, platform

from .test_grpc import ECHO, GRPC_FUNCTION, call_metadata

LIMIT = 96 * 1024
SETTINGS = {"plugins.invocation.account_held_input_max_bytes": str(LIMIT)}


def held(p: Platform) -> HeldInput:
    held_input: HeldInput = cast(Any, p.host.plugin("invocation")).invoker.get().held
    return held_input


async def held_at_least(p: Platform, account: str, size: int) -> None:
    async def enough() -> bool:
        return held(p).held(account) >= size

    await wait_for(enough, timeout=10, what=f"{size} bytes held for {account}")


async def nothing_held(p: Platform) -> None:
    async def empty() -> bool:
        return held(p).accounts() == 0

    await wait_for(empty, timeout=10, what="no account holding input")


def padded(size: int) -> bytes:
    return b'{"pad": "' + b"x" * (size - 11) + b'"}'


async def test_an_accounts_request_bodies_held_on_a_node_are_bounded(tmp_path: Path) -> None:
    async with platform(tmp_path, **SETTINGS) as p, agent(p.bus):
        fid, _ = await deployed(p.admin)
        neighbour = p.api(await other_account_key(p, "neighbour", scopes.ACCOUNT_ADMIN_SCOPES))
        theirs, _ = await deployed(neighbour)
        account = (await p.key.get("/v2/nvcf/functions")).json["functions"][0]["ncaId"]
        base, poll = p.host.endpoints.url, {"NVCF-POLL-SECONDS": "1"}
        release = anyio.Event()
        statuses: list[int] = []

        async def slow_body() -> Any:
            yield padded(64 * 1024)[:-2]
            await release.wait()  # the client pauses: what the node read so far stays held
            yield b'"}'

        async def slow_call() -> None:
            async with p.key.session.post(
                f"{base}/v2/nvcf/pexec/functions/{fid}",
                data=slow_body(),
                headers={"Authorization": f"Bearer {p.key.token}", "Content-Type": "application/json", **poll},
            ) as resp:
                statuses.append(resp.status)

        async with anyio.create_task_group() as tg:
            tg.start_soon(slow_call)
            await held_at_least(p, account, 64 * 1024 - 2)
            # 48 KiB more would pass 96 KiB: refused before it is read, with what the limit is and when to retry.
            body = padded(48 * 1024)
            refused = await p.key.post(f"/v2/nvcf/pexec/functions/{fid}", data=body, headers=poll)
            assert refused.status == 429, refused.body
            assert SETTING in refused.detail and refused.headers["Retry-After"] == "1"
            # The LLM gateway holds what it reads too, and says so in OpenAI's shape.
            async with p.key.session.post(  # its routes are OpenAI's, not in /v3/openapi: no checked client
                f"{base}/v1/chat/completions",
                data=b'{"model": "any", "messages": [], "pad": "' + b"x" * 48 * 1024 + b'"}',
                headers={"Authorization": f"Bearer {p.key.token}", "Content-Type": "application/json"},
            ) as chat:
                assert chat.status == 429 and chat.headers["Retry-After"] == "1", await chat.text()
                assert SETTING in (await chat.json())["error"]["message"]
            # Another account is not held back by this one: its call is taken (queued: nothing serves).
            assert (await neighbour.post(f"/v2/nvcf/pexec/functions/{theirs}", data=body, headers=poll)).status == 202
            # A small call still fits beside the slow one.
            assert (await p.key.post(f"/v2/nvcf/pexec/functions/{fid}", {"m": 1}, headers=poll)).status == 202
            release.set()
        assert statuses == [202]
        await nothing_held(p)  # every call gave back what it held: the table holds calls in flight, not history
        assert (await p.key.post(f"/v2/nvcf/pexec/functions/{fid}", data=body, headers=poll)).status == 202


@pytest.mark.slow
async def test_an_accounts_calls_in_flight_on_a_node_are_bounded(tmp_path: Path) -> None:
    import grpc

    settings = {"plugins.invocation.account_calls_in_flight_max": "2"}
    async with platform(tmp_path, **settings) as p, agent(p.bus):
        fid, _ = await deployed(p.admin)
        gid, _ = await deployed(p.admin, GRPC_FUNCTION)
        neighbour = p.api(await other_account_key(p, "neighbour", scopes.ACCOUNT_ADMIN_SCOPES))
        theirs, _ = await deployed(neighbour)
        account = (await p.key.get("/v2/nvcf/functions")).json["functions"][0]["ncaId"]
        path = f"/v2/nvcf/pexec/functions/{fid}"
        statuses: list[int] = []

        async def waiting() -> None:  # nothing serves: it waits its poll window, then 202
            statuses.append((await p.key.post(path, {"m": 1}, headers={"NVCF-POLL-SECONDS": "3"})).status)

        accepted = await p.key.post(path, {"m": 0}, headers={"NVCF-POLL-SECONDS": "1"})
        assert accepted.status == 202

        async def polling() -> None:  # a status poll waits as a call does
            status = f"/v2/nvcf/pexec/status/{accepted.headers['NVCF-REQID']}"
            statuses.append((await p.key.get(status, headers={"NVCF-POLL-SECONDS": "3"})).status)

        async with anyio.create_task_group() as tg:
            tg.start_soon(waiting)
            tg.start_soon(polling)

            async def two() -> bool:
                return held(p).calls(account) == 2

            await wait_for(two, timeout=10, what="two calls in flight")
            metrics = (await p.anonymous.get("/metrics")).body.decode()
            assert "nvcf_invocation_calls_in_flight 2" in metrics, metrics  # the node's total, no account label
            refused = await p.key.post(path, {"m": 3}, headers={"NVCF-POLL-SECONDS": "1"})
            assert refused.status == 429 and refused.headers["Retry-After"] == "1", refused.body
            assert CALLS_SETTING in refused.detail
            async with grpc.aio.insecure_channel(p.host.endpoints.grpc_address) as channel:
                unary = channel.unary_unary(ECHO, request_serializer=bytes, response_deserializer=EchoResponse().parse)
                with pytest.raises(grpc.aio.AioRpcError) as grpc_refused:
                    await unary(EchoRequest(message="m"), metadata=tuple(call_metadata(p.key.token, gid).items()))
                assert grpc_refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert CALLS_SETTING in (grpc_refused.value.details() or "")
            # Another account calls on.
            theirs_call = await neighbour.post(
                f"/v2/nvcf/pexec/functions/{theirs}", {"m": 1}, headers={"NVCF-POLL-SECONDS": "1"}
            )
            assert theirs_call.status == 202, theirs_call.body
        assert statuses == [202, 202]
        await nothing_held(p)
        metrics = (await p.anonymous.get("/metrics")).body.decode()
        assert 'nvcf_invocation_account_limit_refusals_total{limit="calls_in_flight"} 2' in metrics
        assert "nvcf_invocation_calls_in_flight 0" in metrics
        assert (await p.key.post(path, {"m": 4}, headers={"NVCF-POLL-SECONDS": "1"})).status == 202


async def test_a_body_stored_in_the_object_store_is_not_held_while_its_call_waits(tmp_path: Path) -> None:
    settings = {**SETTINGS, "plugins.invocation.inline_body_limit": "16KiB"}
    async with platform(tmp_path, **settings) as p, agent(p.bus):
        fid, _ = await deployed(p.admin)
        account = (await p.key.get("/v2/nvcf/functions")).json["functions"][0]["ncaId"]
        statuses: list[int] = []

        async def call() -> None:  # past the inline limit: streamed into the object store, then queued
            reply = await p.key.post(
                f"/v2/nvcf/pexec/functions/{fid}", data=padded(80 * 1024), headers={"NVCF-POLL-SECONDS": "3"}
            )
            statuses.append(reply.status)

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)

            async def stored_and_waiting() -> bool:
                return held(p).calls(account) == 1 and held(p).held(account) == 0

            await wait_for(stored_and_waiting, timeout=10, what="the call waiting with its body stored")
        assert statuses == [202]


def _stream_call(channel: Any, path: str) -> Any:
    return channel.stream_stream(path, request_serializer=bytes, response_deserializer=EchoResponse().parse)


@pytest.mark.slow
async def test_an_accounts_grpc_input_held_on_a_node_is_bounded(tmp_path: Path) -> None:
    import grpc  # grpcio: a test dependency (grpcio-tools), not the platform's

    async with platform(tmp_path, **SETTINGS) as p, agent(p.bus):
        fid, _ = await deployed(p.admin, GRPC_FUNCTION)
        neighbour = p.api(await other_account_key(p, "neighbour", scopes.ACCOUNT_ADMIN_SCOPES))
        theirs, _ = await deployed(neighbour, GRPC_FUNCTION)
        account = (await p.key.get("/v2/nvcf/functions")).json["functions"][0]["ncaId"]
        md = tuple(call_metadata(p.key.token, fid).items())
        big = EchoRequest(message="x" * 48 * 1024)
        async with grpc.aio.insecure_channel(p.host.endpoints.grpc_address) as channel:
            # A live call (its client keeps its side open) that nobody answers: all it sends is kept.
            live = _stream_call(channel, ECHO)(metadata=md, timeout=60)
            await live.write(EchoRequest(message="y" * 64 * 1024))
            await held_at_least(p, account, 64 * 1024)

            unary = channel.unary_unary(ECHO, request_serializer=bytes, response_deserializer=EchoResponse().parse)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await unary(big, metadata=md, timeout=10)
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert SETTING in (refused.value.details() or "")

            other_live = _stream_call(channel, ECHO)(metadata=md, timeout=10)
            await other_live.write(big)
            assert await other_live.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert SETTING in (await other_live.details() or "")

            # Another account's call of the same size is taken (and waits: nothing serves).
            with pytest.raises(grpc.aio.AioRpcError) as waited:
                await unary(big, metadata=tuple(call_metadata(neighbour.token, theirs).items()), timeout=2)
            assert waited.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED

            live.cancel()
            await nothing_held(p)
            with pytest.raises(grpc.aio.AioRpcError) as taken:
                await unary(big, metadata=md, timeout=2)
            assert taken.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED  # taken this time, and queued


async def test_a_grpc_message_declaring_more_than_a_request_may_be_is_refused_before_it_is_read(
    tmp_path: Path,
) -> None:
    async with platform(tmp_path, **SETTINGS) as p, agent(p.bus):
        fid, _ = await deployed(p.admin, GRPC_FUNCTION)
        host, _, port = p.host.endpoints.grpc_address.rpartition(":")
        channel = Channel(host, int(port))
        try:
            with anyio.fail_after(10), pytest.raises(GRPCError) as refused:  # before: it waited for 4 GiB
                async with channel.request(
                    ECHO,
                    Cardinality.STREAM_STREAM,
                    RawMessage,
                    RawMessage,
                    metadata=call_metadata(p.key.token, fid),
                    timeout=60,
                ) as stream:
                    await stream.send_request()
                    # A message prefix declaring 4 GiB - 1, and the first kilobyte of it.
                    await stream._stream.send_data(struct.pack(">BI", 0, 2**32 - 1) + b"z" * 1024)
                    await stream.recv_message()
            assert refused.value.status == Status.RESOURCE_EXHAUSTED
            assert f"a message of {2**32 - 1} bytes" in (refused.value.message or "")
        finally:
            channel.close()
        await nothing_held(p)


async def test_a_message_over_the_size_a_server_reads_is_refused_without_a_guard() -> None:
    # The same bound on the platform's own gRPC services (a worker's session, uploads): no handler
    # buffers a declared 4 GiB.
    from nvcf_mono.grpc.compression import MAX_INFLATED, _recv_message, guarded

    asked: list[int] = []

    class Declaring:
        headers = None

        async def recv_data(self, size: int) -> bytes:
            asked.append(size)
            return struct.pack(">BI", 0, MAX_INFLATED + 1)

    with pytest.raises(GRPCError) as refused:
        await _recv_message(Declaring(), None, RawMessage, most=MAX_INFLATED)
    assert refused.value.status == Status.RESOURCE_EXHAUSTED and asked == [5]

    # A handler's guard is for what its client sends, not for answers the handler reads as a client.
    class Answering:
        headers = None

        async def recv_data(self, size: int) -> bytes:
            return struct.pack(">BI", 0, 3) if size == 5 else b"abc"

    def refuse(size: int) -> None:
        raise AssertionError(f"guarded a client's read of {size} bytes")

    with guarded(refuse):
        message = await _recv_message(Answering(), ProtoCodec(), RawMessage)
    assert message.data == b"abc"
