"""A worker that resets its Serve stream right after its hello, hundreds of times, as a flaky network or a
worker killed while connecting does: each session ends quietly (grpclib's "Request was cancelled"),
never with an error and a traceback in the node's log, and the node still takes a session afterwards.

The race: the node's sender writes the session's first message while the reset arrives, and fails on
the closed HTTP/2 stream while grpclib cancels the handler. Before, the sender's error reached grpclib
in place of the cancellation ("Failed to handle cancellation", with a traceback), a few times in 300.
"""

from __future__ import annotations

import logging
from pathlib import Path

import anyio
import pytest
from grpclib.client import Channel
from grpclib.const import Cardinality

from nvcf_mono.auth.secret import KEYRING
from nvcf_mono.auth.tokens import TokenSigner, mint_worker_token
from nvcf_mono.proto.gen.nvcf.worker.v1 import ConnectRequest, ConnectResponse, WorkerHello, WorkerMessage
from nvcf_mono.proto.serve_wire import NodeEnvelope, WorkerEnvelope
from nvcf_mono.testing.running import agent
from nvcf_mono.worker.agent import SERVICE

from .conftest import deployed, platform

RESETS = 500


async def test_serve_streams_reset_after_their_hello_end_quietly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with platform(tmp_path) as p, agent(p.bus):  # a scripted agent: no worker of its own connects
        fid, vid = await deployed(p.admin, concurrency=8)
        signer = TokenSigner(p.host.services.get(KEYRING).token_key)
        token = mint_worker_token(
            signer, nca_id="nvcf-default", function_id=fid, function_version_id=vid, request_id="r"
        )
        host, _, port = p.host.endpoints.grpc_address.rpartition(":")
        async with Channel(host, int(port)) as channel:
            with anyio.fail_after(10):
                async with channel.request(
                    f"{SERVICE}/ConnectOnce", Cardinality.UNARY_UNARY, ConnectRequest, ConnectResponse
                ) as call:
                    await call.send_message(
                        ConnectRequest(worker_token=token, instance_id="x", max_concurrency=8, transports=["grpc"]),
                        end=True,
                    )
                    session = await call.recv_message()
            assert session is not None
            hello = WorkerEnvelope(
                message=WorkerMessage(
                    hello=WorkerHello(session_token=session.session_token, instance_id="x", max_concurrency=8)
                )
            )
            with anyio.fail_after(120):
                for i in range(RESETS):
                    async with channel.request(
                        f"{SERVICE}/Serve", Cardinality.STREAM_STREAM, WorkerEnvelope, NodeEnvelope
                    ) as s:
                        await s.send_message(hello)
                        if i % 3:  # the reset at different moments of the session's start
                            await anyio.sleep(0.0005 * (i % 7))
                        await s.cancel()
                # The node still serves a session: it answers a hello with the session's first message.
                async with channel.request(
                    f"{SERVICE}/Serve", Cardinality.STREAM_STREAM, WorkerEnvelope, NodeEnvelope
                ) as s:
                    await s.send_message(hello)
                    first = await s.recv_message()
                    assert first is not None and first.message is not None and first.message.session is not None
                    await s.cancel()
        ended = [r for r in caplog.records if r.name == "grpclib.server"]
        assert ended and all(r.levelno == logging.INFO for r in ended), {r.getMessage() for r in ended}
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert not errors, [(r.name, r.getMessage()) for r in errors[:5]]
