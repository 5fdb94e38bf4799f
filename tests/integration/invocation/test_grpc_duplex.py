"""Full-duplex gRPC through the platform: a client that keeps its side open is served as it sends.

Clients are grpcio's (as users have them); the function is the example gRPC server in a real process
beside a real ``nvcf-mono worker``, on both worker transports. Before live input, a client that
waited for an answer before sending its next message waited until its deadline: the proxy collected
the whole request stream first.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from nvcf_mono.contracts import live_input, states, subjects
from nvcf_mono.proto.gen.examples.echo.v1 import EchoRequest, EchoResponse
from nvcf_mono.proto.gen.grpc.health.v1 import HealthCheckRequest, HealthCheckResponse, HealthCheckResponseServingStatus
from nvcf_mono.testing.platform import wait_for

from .conftest import deployed, launching_agent, platform, two_invocation_nodes
from .test_grpc import GRPC_FUNCTION, call_metadata

SERVICE = "/examples.echo.v1.EchoService"
BOTH_TRANSPORTS = pytest.mark.parametrize("transport", ["grpc", "nats"])


def _converse(channel: Any) -> Any:
    return channel.stream_stream(
        f"{SERVICE}/Converse", request_serializer=bytes, response_deserializer=EchoResponse().parse
    )


@pytest.mark.slow
@BOTH_TRANSPORTS
async def test_a_client_that_waits_for_each_answer_is_served_as_it_sends(tmp_path: Path, transport: str) -> None:
    import grpc  # grpcio: a test dependency (grpcio-tools), not the platform's

    settings = {"plugins.invocation.transport": transport}
    async with platform(tmp_path, **settings) as p, launching_agent(p, tmp_path / "instances"):
        fid, _ = await deployed(p.admin, GRPC_FUNCTION)
        md = tuple(call_metadata(p.key.token, fid).items())
        async with grpc.aio.insecure_channel(p.host.endpoints.grpc_address) as channel:
            # Ping-pong: each message is sent only once the answer to the one before it came.
            call = _converse(channel)(metadata=md, timeout=30)
            with anyio.fail_after(20):
                for n in range(5):
                    await call.write(EchoRequest(message=f"ping{n}", repeats=2))
                    reply = await call.read()
                    assert (reply.index, reply.message) == (n, f"ping{n}" * 2)
                await call.done_writing()
                assert await call.read() == grpc.aio.EOF
                assert await call.code() == grpc.StatusCode.OK
                assert (await call.initial_metadata())["nvcf-reqid"]

            # Client streaming, its messages paced: one answer with all of them, in order.
            collect = channel.stream_unary(
                f"{SERVICE}/Collect", request_serializer=bytes, response_deserializer=EchoResponse().parse
            )

            async def paced() -> Any:
                for word in ("one", "two", "three", "four"):
                    yield EchoRequest(message=word)
                    await anyio.sleep(0.2)

            with anyio.fail_after(20):
                reply = await collect(paced(), metadata=md, timeout=30)
            assert (reply.message, reply.index) == ("one two three four", 4)

            # A unary call still closes its side at once: stored whole, as before.
            echo = channel.unary_unary(
                f"{SERVICE}/Echo", request_serializer=bytes, response_deserializer=EchoResponse().parse
            )
            with anyio.fail_after(15):
                assert (await echo(EchoRequest(message="u"), metadata=md, timeout=15)).message == "u"
                with pytest.raises(grpc.aio.AioRpcError) as failed:
                    await echo(EchoRequest(message="nope", status_code=5), metadata=md, timeout=15)
            assert failed.value.code() == grpc.StatusCode.NOT_FOUND
        # Each call is counted with the status it ended with (the proxy's own errors too, not as INTERNAL).
        metrics = (await p.anonymous.get("/metrics")).body.decode()
        counted = [line for line in metrics.splitlines() if line.startswith("grpc_server_handled_total{")]
        assert 'grpc_server_handled_total{method="*",code="NOT_FOUND"} 1' in counted, counted  # "*": a function's
        assert not any('code="INTERNAL"' in line for line in counted), counted


@pytest.mark.slow
async def test_a_client_that_leaves_mid_call_ends_it_and_its_input_is_no_ones(tmp_path: Path) -> None:
    import grpc

    # The nats transport: its worker asks the client's node over NATS itself, so the question shows on
    # the bus (a grpc-transport worker's node on the client's own node reads it directly).
    async with (
        platform(tmp_path, **{"plugins.invocation.transport": "nats"}) as p,
        launching_agent(p, tmp_path / "instances"),
    ):
        fid, _ = await deployed(p.admin, GRPC_FUNCTION)
        md = tuple(call_metadata(p.key.token, fid).items())
        async with (
            p.bus.subscribe(f"{subjects.INPUT_ROOT}>") as questions,
            grpc.aio.insecure_channel(p.host.endpoints.grpc_address) as channel,
        ):
            call = _converse(channel)(metadata=md, timeout=60)
            with anyio.fail_after(20):
                await call.write(EchoRequest(message="first"))
                assert (await call.read()).message == "first"
                reqid = (await call.initial_metadata())["nvcf-reqid"]
                # The serving side asks the client's node for what follows (seen here on the bus).
                asked = await anext(aiter(questions))
            prefix, _, capability = asked.subject.rpartition(".")
            assert prefix.endswith(f".{reqid}") and capability

            # The call's live input is served only with its capability: a guessed one reads nothing.
            for guess in ("x", "A" * len(capability), capability[:-1] + ("A" if capability[-1] != "A" else "B")):
                reply = await p.bus.request(f"{prefix}.{guess}", live_input.question(0), timeout=5)
                assert reply.data == live_input.GONE, guess

            call.cancel()
            # The function's side ends too: the instance takes the next call at once (max concurrency 1).
            started = time.monotonic()
            with anyio.fail_after(20):
                again = _converse(channel)(metadata=md, timeout=30)
                await again.write(EchoRequest(message="again"))
                assert (await again.read()).message == "again"
                await again.done_writing()
                assert await again.code() == grpc.StatusCode.OK
            assert time.monotonic() - started < 10


@pytest.mark.slow
async def test_long_sessions_and_slow_clients(
    tmp_path: Path,
) -> None:
    import grpc

    limit = 64 * 1024
    async with (
        platform(
            tmp_path,
            **{"plugins.invocation.max_request_body": str(limit), "plugins.invocation.default_poll_seconds": "1"},
        ) as p,
        launching_agent(p, tmp_path / "instances"),
    ):
        fid, _ = await deployed(p.admin, GRPC_FUNCTION)
        md = tuple(call_metadata(p.key.token, fid).items())
        async with grpc.aio.insecure_channel(p.host.endpoints.grpc_address) as channel:
            # Answered as it goes: five times the limit passes (what the function read is let go).
            call = _converse(channel)(metadata=md, timeout=60)
            chunk = "c" * 8000
            with anyio.fail_after(30):
                for n in range(40):
                    await call.write(EchoRequest(message=f"{n}:{chunk}"))
                    assert (await call.read()).message == f"{n}:{chunk}"
                await call.done_writing()
                assert await call.code() == grpc.StatusCode.OK

            # A client without a deadline that takes longer to send than the wait for a first answer
            # (default_poll_seconds, 1 s here): its call is served, so the answer is waited for.
            collect = channel.stream_unary(
                f"{SERVICE}/Collect", request_serializer=bytes, response_deserializer=EchoResponse().parse
            )

            async def slowly() -> Any:
                for word in ("a", "b", "c", "d", "e", "f"):
                    yield EchoRequest(message=word)
                    await anyio.sleep(0.3)

            with anyio.fail_after(30):
                assert (await collect(slowly(), metadata=md)).message == "a b c d e f"

            # Unanswered until the client is done: the whole stream is kept (another instance could
            # need it), so past the limit the call ends RESOURCE_EXHAUSTED, as a whole request would.
            # The client stops writing once it has sent past the limit: grpcio reports a write that the
            # ended call refuses as its own INTERNAL ("Internal error from Core"), not the call's status.
            call = collect(metadata=md, timeout=30)
            with anyio.fail_after(30):
                for n in range(limit // len(chunk) + 1):
                    await call.write(EchoRequest(message=f"{n}:{chunk}"))
                    await anyio.sleep(0.01)
                assert await call.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, await call.details()
            assert f"limit of {limit} bytes" in (await call.details() or "")


@pytest.mark.slow
async def test_a_live_call_whose_client_is_on_another_node(tmp_path: Path) -> None:
    """The client calls node B; the instance's worker is connected to node A only (grpc transport), so
    node A asks node B for the client's stream over NATS.
    """
    import grpc

    async with (
        two_invocation_nodes(tmp_path) as (p, b, _),
        launching_agent(p, tmp_path / "instances", worker_addresses=(p.host.endpoints.grpc_address,)),
    ):
        fid, _ = await deployed(p.admin, GRPC_FUNCTION)
        md = tuple(call_metadata(p.key.token, fid).items())
        async with grpc.aio.insecure_channel(b.endpoints.grpc_address) as channel:
            call = _converse(channel)(metadata=md, timeout=30)
            with anyio.fail_after(20):
                for n in range(5):
                    await call.write(EchoRequest(message=f"far{n}"))
                    assert (await call.read()).message == f"far{n}"
                await call.done_writing()
                assert await call.code() == grpc.StatusCode.OK


@pytest.mark.slow
@BOTH_TRANSPORTS
async def test_a_live_call_whose_function_dies_before_answering_is_served_whole_by_another(
    tmp_path: Path, transport: str
) -> None:
    """Everything the client sent is kept until the function answers: a redelivered call reads it again."""
    import grpc

    settings = {"plugins.invocation.transport": transport}
    async with platform(tmp_path, **settings) as p, launching_agent(p, tmp_path / "instances") as fake:
        fid, _ = await deployed(p.admin, GRPC_FUNCTION, min_instances=2, max_instances=2)

        async def both_running() -> bool:
            return sum(i.state == states.RUNNING for i in fake.instances.values()) == 2

        await wait_for(both_running, timeout=30, what="two running instances")
        assert fake.launcher is not None
        workers = p.host.plugin("invocation").workers

        async def holder() -> Any:
            for session in list(workers.sessions.values()):
                if session.in_flight or session.held_remotely:
                    return fake.launcher.running[session.instance_id.removeprefix("0-sr-")]
            return None

        md = tuple(call_metadata(p.key.token, fid).items())
        async with grpc.aio.insecure_channel(p.host.endpoints.grpc_address) as channel:
            collect = channel.stream_unary(
                f"{SERVICE}/Collect", request_serializer=bytes, response_deserializer=EchoResponse().parse
            )

            async def words() -> Any:
                for n, word in enumerate("abcdef"):
                    if n == 3:  # half sent, and read by the function: its server dies
                        victim = await wait_for(holder, timeout=10, what="the instance serving the call")
                        victim.inference.kill()
                    yield EchoRequest(message=word)
                    await anyio.sleep(0.2)

            with anyio.fail_after(30):
                reply = await collect(words(), metadata=md, timeout=30)
        assert (reply.message, reply.index) == ("a b c d e f", 6)


@pytest.mark.slow
async def test_a_health_check_that_names_a_function_is_answered_by_the_function(tmp_path: Path) -> None:
    """grpc.health.v1 is also a path the host serves (its own health): with ``function-id`` metadata the
    call is the function's, as every call that names one (standard health probes through the platform).
    """
    import grpc

    async with platform(tmp_path) as p, launching_agent(p, tmp_path / "instances"):
        fid, _ = await deployed(p.admin, GRPC_FUNCTION)
        md = tuple(call_metadata(p.key.token, fid).items())
        async with grpc.aio.insecure_channel(p.host.endpoints.grpc_address) as channel:
            check = channel.unary_unary(
                "/grpc.health.v1.Health/Check",
                request_serializer=bytes,
                response_deserializer=HealthCheckResponse().parse,
            )
            with anyio.fail_after(15):
                call = check(HealthCheckRequest(service="examples.echo.v1.EchoService"), metadata=md, timeout=10)
                assert (await call).status == HealthCheckResponseServingStatus.SERVING
                assert (await call.initial_metadata())["nvcf-reqid"]  # through the proxy
                # A service the platform has (its invocation plugin) but the function does not.
                with pytest.raises(grpc.aio.AioRpcError) as unknown:
                    await check(HealthCheckRequest(service="invocation"), metadata=md, timeout=10)
                assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
                # Without function-id it is the platform's own health, as before.
                mine = await check(HealthCheckRequest(service="invocation"), timeout=10)
                assert mine.status == HealthCheckResponseServingStatus.SERVING
            # A function id without a key is refused as any function call is.
            with anyio.fail_after(15), pytest.raises(grpc.aio.AioRpcError) as refused:
                await check(HealthCheckRequest(service=""), metadata=(("function-id", fid),), timeout=10)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
