"""An invocation node that stops drains: its callers get their answers, wherever their worker is."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from nvcf_mono.lifecycle import HTTP_REQUEST, PluginState
from nvcf_mono.proto.serve_wire import NODE_STOPPING
from nvcf_mono.testing.platform import wait_for

from .conftest import deployed, launching_agent, two_invocation_nodes

pytestmark = pytest.mark.slow


async def test_a_stopping_node_answers_its_callers_served_by_another_nodes_worker(tmp_path: Path) -> None:
    """Node B takes the call; the instance's worker is connected to node A, whose frames reach B over
    the bus. B stops while the call runs: the call is still answered (B used to stop hearing frames at
    the first signal, and its caller waited out the drain)."""
    async with two_invocation_nodes(tmp_path) as (p, b, key_b), launching_agent(p, tmp_path / "instances"):
        fid, _ = await deployed(p.admin)
        warm = await key_b.post(f"/v2/nvcf/pexec/functions/{fid}", {"message": "warm"})
        assert warm.status == 200, warm.body
        answers: list[Any] = []

        async def call() -> None:
            answers.append(await key_b.post(f"/v2/nvcf/pexec/functions/{fid}", {"message": "slow", "delay": 1.5}))

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)

            async def on_b() -> bool:
                return b.inflight.of(HTTP_REQUEST) == 1

            await wait_for(on_b, timeout=10, what="the call on B")
            b.request_shutdown()
        (answer,) = answers
        assert answer.status == 200 and answer.json["message"] == "slow", answer.body


async def test_a_stopping_node_ends_its_workers_sessions_once_what_they_hold_is_answered(tmp_path: Path) -> None:
    """The instance's worker is connected to node B. B stops while the worker serves a call: the call
    is answered, and B ends the session then (its worker is told to go elsewhere), not at the end of
    its drain, which it used to wait out for the idle session before cutting it."""
    settings = {"shutdown.drain_grace": "60"}
    async with two_invocation_nodes(tmp_path, **settings) as (p, b, _):
        instances = tmp_path / "instances"
        async with launching_agent(p, instances, worker_addresses=(b.endpoints.grpc_address,)):
            fid, _ = await deployed(p.admin)
            url = f"/v2/nvcf/pexec/functions/{fid}"
            warm = await p.key.post(url, {"message": "warm"})  # taken on A, served through B's session
            assert warm.status == 200, warm.body
            sessions = b.plugin("invocation").workers.sessions  # type: ignore[attr-defined]
            answers: list[Any] = []

            async def call() -> None:
                answers.append(await p.key.post(url, {"message": "slow", "delay": 1.5}))

            async def held() -> bool:
                return any(session.in_flight for session in sessions.values())

            async def stopped() -> bool:
                return b.plugin_state("invocation") is PluginState.STOPPED

            async def settled() -> bool:
                return not await held()

            await wait_for(settled, timeout=10, what="the warm-up call settled on B")
            async with anyio.create_task_group() as tg:
                tg.start_soon(call)
                await wait_for(held, timeout=10, what="the call held by B's session")
                b.request_shutdown()
                await wait_for(stopped, timeout=30, what="B stopped well within its 60 s drain")
            (answer,) = answers
            assert answer.status == 200 and answer.json["message"] == "slow", answer.body

            async def told() -> bool:  # the worker was told why, and connects again (here: to B, gone)
                logs = "".join(path.read_text(errors="replace") for path in instances.rglob("*.log"))
                return f"INFO    nvcf_mono.worker: connection to the invocation plane lost ({NODE_STOPPING})" in logs

            await wait_for(told, timeout=10, what="the worker's log saying the node stopped")


async def test_a_stopping_node_under_steady_load_lets_its_nats_transport_worker_go_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """nats transport: the worker pulls its requests itself. Node B, its session's node, stops while
    calls keep coming: the worker is told at once, stops pulling, finishes what it holds, and connects
    again where its address now points (node A, as a balancer would send it). B used to say so only
    once the worker held nothing, which steady load never allows: B waited out its whole drain."""
    settings = {"shutdown.drain_grace": "60", "plugins.invocation.transport": "nats"}
    address = tmp_path / "grpc-address"  # what the worker dials, read before each connection
    async with two_invocation_nodes(tmp_path, **settings) as (p, b, _):
        address.write_text(b.endpoints.grpc_address)
        monkeypatch.setenv("NVCF_FQDN_GRPC_FILE", str(address))
        async with launching_agent(p, tmp_path / "instances"):
            fid, _ = await deployed(p.admin)
            url = f"/v2/nvcf/pexec/functions/{fid}"
            warm = await p.key.post(url, {"message": "warm"})
            assert warm.status == 200, warm.body
            assert b.plugin("invocation").workers.sessions  # type: ignore[attr-defined]
            answers: list[Any] = []
            quiet = anyio.Event()

            async def caller() -> None:
                while not quiet.is_set():
                    answers.append(await p.key.post(url, {"message": "steady", "delay": 0.4}))

            async def stopped() -> bool:
                return b.plugin_state("invocation") is PluginState.STOPPED

            async with anyio.create_task_group() as tg:
                for _ in range(3):  # the worker (concurrency 4 here) always holds one
                    tg.start_soon(caller)
                await anyio.sleep(1.0)
                address.write_text(p.host.endpoints.grpc_address)
                b.request_shutdown()
                await wait_for(stopped, timeout=20, what="B stopped well within its 60 s drain")
                served = len(answers)

                async def serving_on() -> bool:
                    return len(answers) > served

                # A deadline, not a fixed pause: a loaded machine may take seconds to dial again.
                await wait_for(serving_on, timeout=15, what="the worker serving on, through node A")
                quiet.set()
            assert all(a.status == 200 and a.json["message"] == "steady" for a in answers), answers
