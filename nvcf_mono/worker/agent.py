"""The worker's life: wait for a healthy inference server, connect, serve, reconnect, drain.

One Serve stream to the invocation plane; each request it delivers runs in its own task (never more
than ``MAX_REQUEST_CONCURRENCY`` at once, the node sees to that), its frames go back up the same
stream. Cancel messages stop a request's call to the inference server. While the inference server
fails its health checks the worker tells the node it is not ready (no new work) and its own
``/v1/health/ready`` says 503.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import AsyncIterator
from functools import partial
from typing import final

import aiohttp
import anyio
import betterproto
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectSendStream
from grpclib.client import Channel
from grpclib.const import Cardinality
from grpclib.exceptions import GRPCError, StreamTerminatedError

from nvcf_mono.contracts.frames import FrameError, Request
from nvcf_mono.proto.gen.nvcf.worker.v1 import (
    BodyChunk,
    BodyRequest,
    ConnectRequest,
    ConnectResponse,
    Drain,
    NodeMessage,
    RequestFailed,
    SecretsRequest,
    SecretsResponse,
    WorkerHello,
    WorkerMessage,
    WorkerStatus,
)
from nvcf_mono.worker.assets import download_assets
from nvcf_mono.worker.config import WorkerConfig
from nvcf_mono.worker.grpc_relay import grpc_call
from nvcf_mono.worker.inference import InferenceCrashed, call, check_health, problem_frame, request_headers

SERVICE = "/nvcf.worker.v1.WorkerService"
log = logging.getLogger("nvcf_mono.worker")


@final
class WorkerState:
    """What the health endpoints report."""

    def __init__(self) -> None:
        self.inference_healthy = False
        self.connected = False
        self.draining = False
        self.detail = "waiting for the inference server"
        self.in_flight = 0
        self.served = 0

    @property
    def ready(self) -> bool:
        return self.inference_healthy and self.connected and not self.draining


@final
class Worker:
    """Runs until cancelled or drained."""

    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        self.state = WorkerState()
        host, _, port = config.grpc_address.rpartition(":")
        self._host, self._port = host or "127.0.0.1", int(port)
        self._cancels: dict[str, anyio.CancelScope] = {}
        self._health_changed = anyio.Event()
        self._drain = anyio.Event()

    def request_drain(self) -> None:
        """Finish what is held, take nothing new, then stop."""
        self.state.draining = True
        self._drain.set()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            await self._wait_healthy(http)
            task_status.started()
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._watch_health, http)
                await self._serve_forever(http)
                tg.cancel_scope.cancel()

    # ---- health of the inference server ---------------------------------------------------------

    async def _wait_healthy(self, http: aiohttp.ClientSession) -> None:
        deadline = time.monotonic() + self.config.ready_timeout
        while True:
            healthy, why = await check_health(http, self.config)
            if healthy:
                self.state.inference_healthy = True
                self.state.detail = ""
                return
            self.state.detail = why
            if time.monotonic() > deadline:
                raise TimeoutError(f"the inference server was not healthy within {self.config.ready_timeout:g}s: {why}")
            await anyio.sleep(min(self.config.health_interval, 0.5))

    async def _watch_health(self, http: aiohttp.ClientSession) -> None:
        while True:
            await anyio.sleep(self.config.health_interval)
            healthy, why = await check_health(http, self.config)
            if healthy != self.state.inference_healthy:
                log.info("inference server %s%s", "healthy" if healthy else "unhealthy: ", why)
                self.state.inference_healthy = healthy
                self.state.detail = why
                self._health_changed.set()

    # ---- the connection to the invocation plane --------------------------------------------------

    async def _serve_forever(self, http: aiohttp.ClientSession) -> None:
        delay = 0.2
        while not self._drain.is_set():
            try:
                async with _channel(self._host, self._port) as channel:
                    session = await self._connect(channel)
                    delay = 0.2
                    await self._serve(channel, session, http)
            except (GRPCError, StreamTerminatedError, OSError, ConnectionError, TimeoutError) as err:
                self.state.connected = False
                if self._drain.is_set():
                    return
                log.warning("connection to the invocation plane lost (%s); retrying in %.1fs", err, delay)
                await anyio.sleep(delay * random.uniform(0.8, 1.2))
                delay = min(delay * 2, 10.0)

    async def _connect(self, channel: Channel) -> ConnectResponse:
        with anyio.fail_after(30):
            async with channel.request(
                f"{SERVICE}/ConnectOnce", Cardinality.UNARY_UNARY, ConnectRequest, ConnectResponse
            ) as stream:
                await stream.send_message(
                    ConnectRequest(
                        worker_token=self.config.worker_token,
                        instance_id=self.config.instance_id,
                        max_concurrency=self.config.max_concurrency,
                        transports=["grpc"],
                    ),
                    end=True,
                )
                reply = await stream.recv_message()
                assert reply is not None
                return reply

    async def _serve(self, channel: Channel, session: ConnectResponse, http: aiohttp.ClientSession) -> None:
        async with channel.request(f"{SERVICE}/Serve", Cardinality.STREAM_STREAM, WorkerMessage, NodeMessage) as stream:
            await stream.send_message(
                WorkerMessage(
                    hello=WorkerHello(
                        session_token=session.session_token,
                        instance_id=self.config.instance_id,
                        max_concurrency=self.config.max_concurrency,
                    )
                )
            )
            self.state.connected = True
            log.info("serving function %s version %s", self.config.function_id, self.config.function_version_id)
            send, recv = anyio.create_memory_object_stream[WorkerMessage](self.config.max_concurrency * 4 + 16)
            async with send, anyio.create_task_group() as tg:

                async def sender() -> None:
                    async with recv:
                        async for message in recv:
                            await stream.send_message(message)

                tg.start_soon(sender)
                tg.start_soon(self._report_health, send)
                tg.start_soon(self._drain_on_request, send)
                async with anyio.create_task_group() as requests:
                    while True:
                        message = await stream.recv_message()
                        if message is None:
                            break
                        kind, _ = betterproto.which_one_of(message, "kind")
                        if kind == "request":
                            requests.start_soon(
                                partial(
                                    self._handle,
                                    message.request.request,
                                    message.request.attempt,
                                    channel=channel,
                                    session=session,
                                    out=send,
                                    http=http,
                                )
                            )
                        elif kind == "cancel":
                            scope = self._cancels.get(message.cancel.request_id)
                            if scope is not None:
                                scope.cancel()
                    if self.state.draining:
                        return
                tg.cancel_scope.cancel()
            self.state.connected = False

    async def _report_health(self, out: MemoryObjectSendStream[WorkerMessage]) -> None:
        while True:
            await self._health_changed.wait()
            self._health_changed = anyio.Event()
            await out.send(
                WorkerMessage(
                    status=WorkerStatus(
                        ready=self.state.inference_healthy,
                        in_flight=self.state.in_flight,
                        max_concurrency=self.config.max_concurrency,
                        detail=self.state.detail,
                    )
                )
            )

    async def _drain_on_request(self, out: MemoryObjectSendStream[WorkerMessage]) -> None:
        await self._drain.wait()
        await out.send(WorkerMessage(drain=Drain(reason="the worker is stopping")))

    # ---- one request ------------------------------------------------------------------------------

    async def _handle(
        self,
        blob: bytes,
        attempt: int,
        *,
        channel: Channel,
        session: ConnectResponse,
        out: MemoryObjectSendStream[WorkerMessage],
        http: aiohttp.ClientSession,
    ) -> None:
        try:
            request = Request.decode(blob)
        except FrameError as err:
            log.error("the node sent a malformed request: %s", err)
            return
        self.state.in_flight += 1
        scope = anyio.CancelScope()
        self._cancels[request.request_id] = scope
        try:
            with scope:
                body = request.body if request.body_object is None else self._body(channel, session, request)
                headers = request_headers(
                    self.config,
                    request,
                    asset_dir=f"{self.config.asset_dir}/{request.request_id}",
                    output_dir=f"{self.config.response_dir}/{request.request_id}",
                )
                try:
                    if request.asset_ids:
                        await download_assets(
                            channel, session, request, f"{self.config.asset_dir}/{request.request_id}"
                        )
                    frames = (
                        grpc_call(self.config, request, request.body, attempt=attempt)
                        if request.grpc
                        else call(http, self.config, request, body, headers, attempt=attempt)
                    )
                    async for frame in frames:
                        await out.send(WorkerMessage(frame=frame.encode()))
                except InferenceCrashed as err:
                    log.warning("request %s: the inference server failed: %s", request.request_id, err)
                    await out.send(WorkerMessage(failed=RequestFailed(request_id=request.request_id, reason=str(err))))
                except (aiohttp.ClientError, TimeoutError) as err:
                    frame = problem_frame(
                        request.request_id,
                        attempt,
                        502,
                        f"calling the inference server failed: {err}",
                        source="inference-connection",
                    )
                    await out.send(WorkerMessage(frame=frame.encode()))
        finally:
            self._cancels.pop(request.request_id, None)
            self.state.in_flight -= 1
            self.state.served += 1

    async def _body(self, channel: Channel, session: ConnectResponse, request: Request) -> AsyncIterator[bytes]:
        async with channel.request(f"{SERVICE}/FetchBody", Cardinality.UNARY_STREAM, BodyRequest, BodyChunk) as stream:
            await stream.send_message(
                BodyRequest(
                    session_token=session.session_token,
                    request_id=request.request_id,
                    body_object=request.body_object or "",
                ),
                end=True,
            )
            async for chunk in stream:
                yield chunk.data


async def fetch_secrets(config: WorkerConfig) -> dict[str, object]:
    """The instance's secrets from the platform (through the invocation plane)."""
    host, _, port = config.grpc_address.rpartition(":")
    async with _channel(host or "127.0.0.1", int(port)) as channel:
        with anyio.fail_after(30):
            async with channel.request(
                f"{SERVICE}/FetchSecrets", Cardinality.UNARY_UNARY, SecretsRequest, SecretsResponse
            ) as stream:
                await stream.send_message(SecretsRequest(worker_token=config.worker_token), end=True)
                reply = await stream.recv_message()
    assert reply is not None
    secrets: dict[str, object] = json.loads(reply.secrets_json or "{}")
    return secrets


class _channel:
    """A grpclib channel closed on exit."""

    def __init__(self, host: str, port: int) -> None:
        self.channel = Channel(host, port)

    async def __aenter__(self) -> Channel:
        return self.channel

    async def __aexit__(self, *exc: object) -> None:
        self.channel.close()
