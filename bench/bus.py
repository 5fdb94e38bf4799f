"""The bus's own cost on this machine: what every hop of a request through the platform pays.

Measures against a local nats-server (the one the embedded mode runs):
- core request/reply round trip (the response relay path),
- JetStream publish with ack (the durable enqueue of every invocation),
- durable pull consumer: publish -> delivery -> ack (the dispatch path),
- KV get (routing caches miss path) and KV CAS update.
"""

from __future__ import annotations

import logging
import statistics
import time
import uuid

import anyio

from nvcf_mono.bus.api import BucketSpec, ConsumerSpec, Retention, StreamSpec
from nvcf_mono.bus.nats import NatsBus, open_nats_bus
from nvcf_mono.config.model import BusSettings
from nvcf_mono.metrics import Metrics
from nvcf_mono.testing.nats_server import NatsServer


def _report(name: str, samples: list[float]) -> None:
    samples.sort()
    p50 = samples[len(samples) // 2] * 1e3
    p99 = samples[min(len(samples) - 1, int(len(samples) * 0.99))] * 1e3
    rate = len(samples) / sum(samples)
    print(f"{name:<44} n={len(samples):>6}  p50 {p50:7.3f} ms  p99 {p99:7.3f} ms  ~{rate:8.0f}/s sequential")


async def _request_reply(bus: NatsBus, n: int) -> list[float]:
    subject = f"bench.echo.{uuid.uuid4().hex}"

    async def echo(msg):  # type: ignore[no-untyped-def]
        return bytes(msg.data)

    samples = []
    async with anyio.create_task_group() as tg:
        await tg.start(bus.serve, subject, echo)
        payload = b"x" * 64
        for _ in range(n):
            t = time.perf_counter()
            await bus.request(subject, payload, timeout=5)
            samples.append(time.perf_counter() - t)
        tg.cancel_scope.cancel()
    return samples


async def _js_publish(bus: NatsBus, n: int) -> list[float]:
    name = f"BENCH_{uuid.uuid4().hex[:8]}"
    await bus.ensure_stream(StreamSpec(name=name, subjects=(f"{name.lower()}.>",), storage="file"))
    stream = bus.stream(name)
    samples = []
    for i in range(n):
        t = time.perf_counter()
        await stream.publish(f"{name.lower()}.x", b"x" * 64, msg_id=str(i))
        samples.append(time.perf_counter() - t)
    await bus.delete_stream(name)
    return samples


async def _dispatch(bus: NatsBus, n: int) -> list[float]:
    name = f"BENCHQ_{uuid.uuid4().hex[:8]}"
    await bus.ensure_stream(StreamSpec(name=name, subjects=(f"{name.lower()}.>",), retention=Retention.WORK_QUEUE))
    stream = bus.stream(name)
    await stream.ensure_consumer(ConsumerSpec(durable="w", ack_wait=30))
    samples = []
    async with stream.consume("w", batch=1, max_inflight=1, fetch_timeout=5) as consumer:
        it = aiter(consumer)
        for i in range(n):
            t = time.perf_counter()
            await stream.publish(f"{name.lower()}.{i}", b"x" * 64, msg_id=str(i))
            delivery = await anext(it)
            await delivery.ack()
            samples.append(time.perf_counter() - t)
    await bus.delete_stream(name)
    return samples


async def _kv(bus: NatsBus, n: int) -> tuple[list[float], list[float]]:
    name = f"bench_{uuid.uuid4().hex[:8]}"
    kv = await bus.ensure_bucket(BucketSpec(name=name))
    revision = await kv.put("k", b"v")
    gets, updates = [], []
    for _ in range(n):
        t = time.perf_counter()
        await kv.get("k")
        gets.append(time.perf_counter() - t)
        t = time.perf_counter()
        revision = await kv.update("k", b"v", revision=revision)
        updates.append(time.perf_counter() - t)
    await bus.delete_stream(f"KV_{name}")
    return gets, updates


async def run(quick: bool) -> None:
    n = 300 if quick else 3000
    server = NatsServer().start()
    try:
        async with open_nats_bus(
            BusSettings(), servers=[server.url], name="bench", metrics=Metrics(), log=logging.getLogger("bench")
        ) as bus:
            print(f"bus benchmarks against nats-server on loopback ({n} iterations each, 64-byte payloads)")
            for _ in range(2 if not quick else 1):  # the first pass warms up connections and caches
                rr = await _request_reply(bus, n)
            _report("core request/reply", rr)
            _report("JetStream publish + ack (file storage)", await _js_publish(bus, n))
            _report("work queue: publish -> fetch -> ack", await _dispatch(bus, n))
            gets, updates = await _kv(bus, n)
            _report("KV get", gets)
            _report("KV update (compare-and-set)", updates)
            print(f"(median of request/reply: {statistics.median(rr) * 1e3:.3f} ms)")
    finally:
        server.close()
