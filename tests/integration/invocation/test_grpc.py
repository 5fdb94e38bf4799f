"""gRPC functions through the platform's gRPC proxy: unary and server-streaming calls, errors, deadlines.

Instances are real processes: the gRPC echo server (``nvcf_mono.examples.grpc_echo``) beside
``nvcf-mono worker``; the client is a plain grpclib channel to the host's gRPC port.
"""

from __future__ import annotations

import sys
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from grpclib.client import Channel
from grpclib.const import Cardinality, Status
from grpclib.exceptions import GRPCError

from nvcf_mono.contracts import subjects
from nvcf_mono.grpc.raw import RawStatusDetails, encode_status
from nvcf_mono.proto.gen.examples.echo.v1 import EchoRequest, EchoResponse, EchoServiceStub, EchoStreamRequest
from nvcf_mono.proto.gen.grpc.health.v1 import HealthCheckRequest, HealthStub
from nvcf_mono.testing.platform import wait_for
from nvcf_mono.testing.running import agent
from nvcf_mono.testing.scripted_agent import inference_command

from .conftest import ECHO_FUNCTION, Platform, deployed, launching_agent, platform

GRPC_FUNCTION = {
    "name": "grpc-echo",
    "inferenceUrl": "/grpc",
    "inferencePort": 9000,
    "containerImage": "grpc-echo",
    "health": {"protocol": "gRPC", "uri": "", "port": 9000, "timeout": "PT5S", "expectedStatusCode": 200},
}
ECHO = "/examples.echo.v1.EchoService/Echo"


@asynccontextmanager
async def grpc_channel(p: Platform) -> AsyncIterator[Channel]:
    host, _, port = p.host.endpoints.grpc_address.rpartition(":")
    channel = Channel(host or "127.0.0.1", int(port), status_details_codec=RawStatusDetails())
    try:
        yield channel
    finally:
        channel.close()


def call_metadata(token: str | None, function_id: str | None, **extra: str | bytes) -> dict[str, str | bytes]:
    md: dict[str, str | bytes] = {}
    if token is not None:
        md["authorization"] = f"Bearer {token}"
    if function_id is not None:
        md["function-id"] = function_id
    md.update({k.replace("_", "-"): v for k, v in extra.items()})
    return md


async def mint_key(p: Platform, scopes: list[str], resources: list[dict[str, str]] | None = None) -> str:
    policy = {
        "product": "nv-cloud-functions",
        "scopes": scopes,
        "resources": resources or [{"id": "*", "type": "account-functions"}],
    }
    reply = await p.admin.post("/v1/keys", {"description": "grpc test key", "authorizations": {"policies": [policy]}})
    assert reply.status == 200, reply.body
    value: str = reply.json["value"]
    return value


async def failure(coro: Any) -> GRPCError:
    with anyio.fail_after(15):
        try:
            await coro
        except GRPCError as err:
            return err
    raise AssertionError("the call succeeded")


async def deadline_exceeded(coro: Any) -> None:
    with anyio.fail_after(15):
        try:
            await coro
        except GRPCError as err:
            assert err.status is Status.DEADLINE_EXCEEDED, err
            return
        except TimeoutError:
            return  # grpclib reports the client's own deadline so (before the proxy's status arrives)
    raise AssertionError("the call succeeded")


@pytest.mark.slow
async def test_unary_and_server_streaming_calls_through_the_proxy(tmp_path: Path) -> None:
    async with platform(tmp_path) as p, launching_agent(p, tmp_path / "instances"), grpc_channel(p) as channel:
        fid, vid = await deployed(p.admin, GRPC_FUNCTION)
        stub = EchoServiceStub(channel)
        key = p.key.token
        assert key is not None

        # Unary: the answer, the client's metadata (binary too) and the worker's nvcf-* metadata
        # reach the function; the key does not; the response names the request.
        md = call_metadata(key, fid, x_trace="abc-123", x_blob_bin=b"\x00\xffraw")
        with anyio.fail_after(15):
            async with channel.request(ECHO, Cardinality.UNARY_UNARY, EchoRequest, EchoResponse, metadata=md) as s:
                await s.send_message(EchoRequest(message="hi", repeats=2), end=True)
                reply = await s.recv_message()
                assert reply is not None
                assert s.initial_metadata is not None
                reqid = s.initial_metadata["nvcf-reqid"]
        assert reply.message == "hihi"
        seen = reply.metadata
        assert seen["x-trace"] == "abc-123"
        assert seen["x-blob-bin"].rstrip("=") == "AP9yYXc"  # base64 of b"\x00\xffraw", as received
        assert seen["nvcf-reqid"] == reqid
        assert seen["nvcf-function-id"] == fid and seen["nvcf-function-version-id"] == vid
        assert "authorization" not in seen

        # Pinned version; the function's own error status, message and details come back as they are.
        pinned = call_metadata(key, fid, function_version_id=vid)
        with anyio.fail_after(15):
            assert (await stub.echo(EchoRequest(message="v"), metadata=pinned)).message == "v"
        err = await failure(stub.echo(EchoRequest(message="no such thing", status_code=5), metadata=pinned))
        assert err.status is Status.NOT_FOUND and err.message == "no such thing"
        assert err.details == encode_status(Status.NOT_FOUND, "no such thing")  # grpc-status-details-bin

        # A method the function does not have: its server's trailers-only UNIMPLEMENTED (grpclib sends
        # it without content-type), at once, as a client calling the function directly gets it.
        started = time.monotonic()
        err = await failure(_unary(channel, "/examples.echo.v1.EchoService/Nope", pinned, timeout=10))
        assert err.status is Status.UNIMPLEMENTED and err.message == "Method not found", err
        assert time.monotonic() - started < 5

        # Messages larger than the inline body limit and than a response frame round-trip intact.
        big = "x" * (4 * 1024 * 1024 + 17)
        with anyio.fail_after(30):
            assert (await stub.echo(EchoRequest(message=big), metadata=pinned)).message == big

        # Server streaming: each message reaches the client before the function sends the next
        # (the function waits for a file the test creates only after it received the message).
        gate = tmp_path / "gate"
        received: list[EchoResponse] = []
        with anyio.fail_after(20):
            request = EchoStreamRequest(message="tick", repeats=3, gate_path=str(gate))
            async for item in stub.echo_stream(request, metadata=call_metadata(key, fid)):
                received.append(item)
                (tmp_path / f"gate.{len(received)}").touch()
        assert [(r.index, r.message) for r in received] == [(0, "tick"), (1, "tick"), (2, "tick")]

        # Invoking a gRPC function over HTTP is a clear 400.
        http = await p.key.post(f"/v2/nvcf/pexec/functions/{fid}", {"message": "hi"})
        assert http.status == 400, http.body
        assert "gRPC function" in http.detail


@pytest.mark.slow
async def test_the_clients_deadline_bounds_the_call_and_cancels_it_in_the_function(tmp_path: Path) -> None:
    async with platform(tmp_path) as p, launching_agent(p, tmp_path / "instances"), grpc_channel(p) as channel:
        fid, _ = await deployed(p.admin, GRPC_FUNCTION, concurrency=1)
        stub = EchoServiceStub(channel)
        md = call_metadata(p.key.token, fid)
        marker = tmp_path / "cancelled"
        slow = EchoRequest(message="slow", delay_seconds=60, cancelled_path=str(marker))
        started = time.monotonic()
        await deadline_exceeded(stub.echo(slow, metadata=md, timeout=1.0))
        assert time.monotonic() - started < 10
        # The cancellation reached the function's server (it stopped waiting), and the instance's
        # only slot is free again: the next call does not wait for the first.

        async def cancelled() -> bool:
            return marker.exists()

        await wait_for(cancelled, timeout=10, what="the function to see the call cancelled")
        with anyio.fail_after(15):
            assert (await stub.echo(EchoRequest(message="next"), metadata=md)).message == "next"


@pytest.mark.slow
async def test_proxy_errors_map_to_grpc_statuses(tmp_path: Path) -> None:
    settings = {"plugins.invocation.default_poll_seconds": "1"}
    async with platform(tmp_path, **settings) as p, agent(p.bus), grpc_channel(p) as channel:
        # Deployed on a scripted agent that starts nothing: ACTIVE, but no worker ever answers.
        fid, vid = await deployed(p.admin, GRPC_FUNCTION)
        http_fid, _ = await deployed(p.admin, ECHO_FUNCTION)
        stub = EchoServiceStub(channel)
        key = p.key.token
        request = EchoRequest(message="hi")

        err = await failure(stub.echo(request, metadata=call_metadata(None, fid)))
        assert err.status is Status.UNAUTHENTICATED and "authorization" in (err.message or "")
        err = await failure(stub.echo(request, metadata=call_metadata("nvapi-not-a-key", fid)))
        assert err.status is Status.UNAUTHENTICATED
        for token in (key, None):  # without function-id it is no function call, key or not
            err = await failure(stub.echo(request, metadata=call_metadata(token, None)))
            assert err.status is Status.INVALID_ARGUMENT and "function-id" in (err.message or "")
        err = await failure(stub.echo(request, metadata=call_metadata(key, "0b7e7cbb-3b8c-4a47-8fa0-000000000000")))
        assert err.status is Status.NOT_FOUND
        for bad_id in ("b c", ">", "*", "../..", "x" * 300):  # ids no function can have: as HTTP's 400, never INTERNAL
            err = await failure(stub.echo(request, metadata=call_metadata(key, bad_id)))
            assert err.status is Status.INVALID_ARGUMENT and "'function-id'" in (err.message or ""), (bad_id, err)
            err = await failure(stub.echo(request, metadata=call_metadata(key, fid, function_version_id=bad_id)))
            assert err.status is Status.INVALID_ARGUMENT and "function-version-id" in (err.message or ""), (bad_id, err)
        err = await failure(stub.echo(request, metadata=call_metadata(key, http_fid)))
        assert err.status is Status.INVALID_ARGUMENT and "not a gRPC function" in (err.message or "")

        no_invoke = await mint_key(p, ["list_functions"])
        err = await failure(stub.echo(request, metadata=call_metadata(no_invoke, fid)))
        assert err.status is Status.PERMISSION_DENIED and "invoke_function" in (err.message or "")
        other_only = await mint_key(p, ["invoke_function"], [{"type": "function", "id": f"{http_fid}/*"}])
        err = await failure(stub.echo(request, metadata=call_metadata(other_only, fid)))
        assert err.status is Status.PERMISSION_DENIED

        # Unknown methods of the host's own services stay UNIMPLEMENTED; its health service still answers.
        err = await failure(_unary(channel, "/grpc.health.v1.Health/Nope", call_metadata(key, None)))
        assert err.status is Status.UNIMPLEMENTED
        with anyio.fail_after(10):
            await HealthStub(channel).check(HealthCheckRequest(service=""))

        # No instance answers within the client's deadline, or (without one) the configured window:
        # DEADLINE_EXCEEDED quoting the request id, and the request is taken out of the queue.
        await deadline_exceeded(stub.echo(request, metadata=call_metadata(key, fid), timeout=1.0))
        md = call_metadata(key, fid)
        with anyio.fail_after(15):
            async with channel.request(ECHO, Cardinality.UNARY_UNARY, EchoRequest, EchoResponse, metadata=md) as s:
                await s.send_message(request, end=True)
                with pytest.raises(GRPCError) as caught:
                    await s.recv_message()
        assert caught.value.status is Status.DEADLINE_EXCEEDED, caught.value
        assert s.trailing_metadata is not None
        region = p.host.settings.node.region
        queue = p.bus.stream(subjects.request_stream(region, vid))
        assert (
            await queue.get_last(subjects.request_subject(region, vid, str(s.trailing_metadata["nvcf-reqid"]))) is None
        )

        async def empty() -> bool:  # the first call's request too (its client hung up at its deadline)
            return (await queue.info()).messages == 0

        await wait_for(empty, timeout=10, what="the version's queue to be empty")


async def _unary(
    channel: Channel, path: str, metadata: dict[str, str | bytes], *, timeout: float | None = None
) -> None:
    cardinality = Cardinality.UNARY_UNARY
    async with channel.request(
        path, cardinality, HealthCheckRequest, EchoResponse, metadata=metadata, timeout=timeout
    ) as s:
        await s.send_message(HealthCheckRequest(service=""), end=True)
        await s.recv_message()


def _grpcio_echo(spec_env: Mapping[str, str], port: int) -> list[str]:
    return [sys.executable, "-m", "tests.support.grpcio_echo", "--port", str(port)]


@pytest.mark.slow
@pytest.mark.parametrize("compressing_function", [False, True], ids=["grpclib-function", "gzip-function"])
async def test_compressed_messages_pass_both_ways(tmp_path: Path, compressing_function: bool) -> None:
    # grpcio clients made with compression= send gzip or deflate messages, and servers set to compress
    # answer so; grpclib refused both (the client's call ended UNKNOWN, the function's answer broke its
    # worker's session). Both clients and servers here are grpcio's, as users have them.
    import grpc  # grpcio: a test dependency (grpcio-tools), not the platform's

    inference = _grpcio_echo if compressing_function else inference_command
    async with platform(tmp_path) as p, launching_agent(p, tmp_path / "instances", inference=inference):
        fid, _ = await deployed(p.admin, GRPC_FUNCTION)
        md = tuple(call_metadata(p.key.token, fid).items())
        async with grpc.aio.insecure_channel(p.host.endpoints.grpc_address) as channel:
            call = channel.unary_unary(ECHO, request_serializer=bytes, response_deserializer=EchoResponse().parse)
            for compression in (grpc.Compression.NoCompression, grpc.Compression.Gzip, grpc.Compression.Deflate):
                message = f"{compression.name} " * 5_000
                with anyio.fail_after(15):
                    reply = await call(EchoRequest(message=message), metadata=md, compression=compression)
                assert reply.message == message, compression
