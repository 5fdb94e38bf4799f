"""Session affinity across invocation nodes, on a real nats-server.

A delivery pulled on one connection and settled from another (its ack subject is all it takes); the
handover's three answers (taken, refused, no answer: left to redelivery, never served twice); the
nodes' announcements of which instance took a conversation; and two real invocation nodes, each with a
real instance, keeping every conversation on one instance.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import anyio
import pytest

from nvcf_mono.bus.api import ConsumerSpec, Delivery, Retention, StreamSpec
from nvcf_mono.bus.handed import HandedDelivery
from nvcf_mono.bus.nats import NatsBus
from nvcf_mono.contracts import subjects
from nvcf_mono.host import Host
from nvcf_mono.metrics import Metrics
from nvcf_mono.planes.invocation import affinity
from nvcf_mono.planes.invocation import handover as handover_module
from nvcf_mono.planes.invocation.affinity import Affinity, Place
from nvcf_mono.planes.invocation.handover import Handover
from nvcf_mono.testing.nats_server import NatsServer
from nvcf_mono.testing.platform import Api, wait_for
from tests.conftest import connect

from .conftest import ECHO_FUNCTION, deployed, launching_agent, two_invocation_nodes

log = logging.getLogger("tests.handover")


async def _queue(bus: NatsBus, name: str, count: int, *, ack_wait: float = 30.0) -> None:
    await bus.ensure_stream(StreamSpec(name=name, subjects=(f"{name.lower()}.>",), retention=Retention.WORK_QUEUE))
    await bus.stream(name).ensure_consumer(ConsumerSpec(durable="workers", ack_wait=ack_wait))
    for i in range(count):
        await bus.stream(name).publish(f"{name.lower()}.{i}", str(i).encode())


def _handed(bus: NatsBus, delivery: Delivery) -> HandedDelivery:
    return HandedDelivery(
        bus,
        ack_subject=delivery.ack_subject,
        subject=delivery.subject,
        data=delivery.data,
        num_delivered=delivery.num_delivered,
    )


async def test_a_delivery_pulled_on_one_connection_is_settled_from_another(
    nats_server: NatsServer, unique: Callable[[str], str]
) -> None:
    name = unique("HANDED")
    async with connect(nats_server.url) as puller, connect(nats_server.url) as other:
        await _queue(puller, name, 3)
        stream = puller.stream(name)
        async with stream.consume("workers", batch=1, max_inflight=1, fetch_timeout=1) as consumer:
            deliveries = aiter(consumer)  # one unsettled delivery at a time
            with anyio.fail_after(10):
                first = await anext(deliveries)
                first.hand_off()  # the one slot is free again although nothing was settled yet
                second = await anext(deliveries)
            assert consumer.statistics().in_flight == 1
            await _handed(other, first).in_progress()
            await _handed(other, first).ack_sync()
            assert (await stream.info()).messages == 2  # acked from the other connection: gone
            second.hand_off()
            await _handed(other, second).nak()
            later = []
            for _ in range(2):
                with anyio.fail_after(10):
                    delivery = await anext(deliveries)
                later.append((delivery.data, delivery.num_delivered))
                delivery.hand_off()
                await _handed(other, delivery).term()
            # The nak from the other connection redelivered it (the third message may come first).
            assert sorted(later) == [(b"1", 2), (b"2", 1)]

        async def emptied() -> bool:
            return (await stream.info()).messages == 0  # terms are plain publishes: not confirmed

        await wait_for(emptied, timeout=10, what="the terms sent from the other connection")


async def test_a_turn_is_taken_refused_or_left_to_redelivery_never_served_twice(
    nats_server: NatsServer, unique: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(handover_module, "TIMEOUT", 0.5)
    name = unique("TURNS")
    answers = ["taken", "refused", "slow"]
    taken: list[Delivery] = []

    async def take(version: str, instance: str, delivery: Delivery) -> bool:
        assert (version, instance) == ("v1", "i-b")
        answer = answers.pop(0)
        if answer == "slow":
            await anyio.sleep(2)  # past the offer's deadline: the offering node cannot know
            return True
        if answer == "taken":
            taken.append(delivery)
        return answer == "taken"

    async with connect(nats_server.url) as bus_a, connect(nats_server.url) as bus_b:
        await _queue(bus_a, name, 3, ack_wait=1.5)
        a, b = Affinity(node=unique("a")), Affinity(node=unique("b"))
        node_a, node_b = Handover(bus_a, a, Metrics(), log), Handover(bus_b, b, Metrics(), log)
        there = Place("i-b", b.node)
        stream = bus_a.stream(name)
        async with anyio.create_task_group() as tg:
            await tg.start(node_b.run, take)
            async with stream.consume("workers", batch=3, max_inflight=3, fetch_timeout=1) as consumer:
                deliveries = aiter(consumer)
                with anyio.fail_after(10):
                    one, two, three = [await anext(deliveries) for _ in range(3)]
                assert await node_a.offer(there, "v1", one) == "taken"
                assert [d.data for d in taken] == [one.data] and taken[0].num_delivered == 1
                await taken[0].ack_sync()  # node b settles it through its own connection
                assert await node_a.offer(there, "v1", two) == "refused"
                await two.ack_sync()  # refused: node a serves it itself
                started = time.monotonic()
                assert await node_a.offer(there, "v1", three) == "unknown"
                three.hand_off()  # neither served nor given back by node a...
                with anyio.fail_after(10):
                    again = await anext(deliveries)
                # ...so it comes back only once its ack wait ran out, not at once as a nak would have it.
                assert again.data == three.data and again.num_delivered == 2
                assert time.monotonic() - started >= 1.0
                await again.ack_sync()
                # No node listens for a node that is gone: refused at once, served here.
                gone = Place("i-c", unique("gone"))
                assert await node_a.offer(gone, "v1", again) == "refused"
                # A request that would not fit in one message with the handover's headers is not offered.
                huge = _handed(bus_a, again)
                huge.data = b"x" * bus_a.max_payload
                assert await node_a.offer(there, "v1", huge) == "refused" and answers == []
                counted = {o: node_a.handovers.value(outcome=o) for o in ("taken", "refused", "unknown")}
                assert counted == {"taken": 1, "refused": 3, "unknown": 1}
            tg.cancel_scope.cancel()
        assert (await stream.info()).messages == 0


async def test_nodes_learn_which_instance_took_a_conversation_from_each_other(
    nats_server: NatsServer, unique: Callable[[str], str]
) -> None:
    version = unique("version")

    async def never(version: str, instance: str, delivery: Delivery) -> bool:
        return False

    async with connect(nats_server.url) as bus_a, connect(nats_server.url) as bus_b:
        a, b = Affinity(node=unique("a")), Affinity(node=unique("b"))
        node_a, node_b = Handover(bus_a, a, Metrics(), log), Handover(bus_b, b, Metrics(), log)
        async with anyio.create_task_group() as tg:
            await tg.start(node_a.run, never)
            await tg.start(node_b.run, never)
            await bus_a.publish(subjects.AFFINITY_TOOK, b"not json")  # ignored; the nodes keep listening
            await bus_a.publish(subjects.AFFINITY_TOOK, b'{"v": "x"}')
            assert a.took(version, "conv", "i-a")
            await node_a.announce(version, "conv", "i-a")
            with anyio.fail_after(10):
                while b.place_of(version, "conv") is None:
                    await anyio.sleep(0.01)
            assert b.place_of(version, "conv") == Place("i-a", a.node)
            assert a.place_of(version, "conv") == Place("i-a", a.node)  # its own announcement changes nothing
            assert b.took(version, "conv", "i-b")  # the conversation moves to node b's instance
            await node_b.announce(version, "conv", "i-b")
            with anyio.fail_after(10):
                while a.place_of(version, "conv") != Place("i-b", b.node):
                    await anyio.sleep(0.01)
            tg.cancel_scope.cancel()


MIRROR = {**ECHO_FUNCTION, "name": "mirror", "inferenceUrl": "/echo-request"}


@pytest.mark.slow
async def test_a_conversations_turns_stay_on_its_instance_whichever_node_pulls_them(tmp_path: Path) -> None:
    """Two invocation nodes, an instance connected to each: both pull the version's queue, yet each
    conversation's turns are served by one instance (without handovers about half would not be).
    """
    async with two_invocation_nodes(tmp_path) as (p, b, key_b):
        addresses = (p.host.endpoints.grpc_address, b.endpoints.grpc_address)
        async with launching_agent(p, tmp_path / "instances", worker_addresses=addresses):
            fid, vid = await deployed(p.admin, MIRROR, min_instances=2, max_instances=2, concurrency=4)

            def serving(host: Host) -> list[Any]:
                workers = cast(Any, host.plugin("invocation")).workers
                return [s for s in workers.sessions.values() if s.function_version_id == vid and s.serving]

            async def one_on_each() -> bool:
                return len(serving(p.host)) == 1 and len(serving(b)) == 1

            await wait_for(one_on_each, timeout=30, what="an instance connected to each node")

            async def turn(api: Api, conversation: str | None = None) -> int:
                headers = {affinity.HEADER: conversation} if conversation else {}
                reply = await api.post(f"/v2/nvcf/pexec/functions/{fid}", {"turn": 1}, headers=headers)
                assert reply.status == 200, reply.body
                return int(reply.json["pid"])

            # Without a conversation both instances serve.
            seen: set[int] = set()
            with anyio.fail_after(30):
                while len(seen) < 2:
                    seen.add(await turn(p.key))
            for name in ("conv-a", "conv-b", "conv-c", "conv-d"):
                served = [await turn(api, name) for api in (p.key, key_b) * 4]
                assert len(set(served)) == 1, (name, served)
            # Turns crossed between the nodes (each node counts what it handed over).
            handed = [cast(Any, host.plugin("invocation")).workers for host in (p.host, b)]
            assert sum(w.deps.get().handover.handovers.value(outcome="taken") for w in handed) > 0
