"""Workers on the nats transport: they pull their version's requests from JetStream themselves,
with NATS credentials the platform grants them through the auth callout (scoped to their version).
"""

from __future__ import annotations

import logging
import os
import signal
import uuid
from pathlib import Path
from typing import Any

import anyio
import nats.errors
import pytest
from nats.aio.client import Client as NatsClient

from nvcf_mono.auth.secret import KEYRING
from nvcf_mono.auth.tokens import TokenSigner
from nvcf_mono.bus.callout import envelope
from nvcf_mono.contracts import permissions, subjects
from nvcf_mono.testing.nats_server import raw_client
from nvcf_mono.testing.platform import wait_for
from tests.support.leftovers import processes_under
from tests.support.procs import Process

from .conftest import deployed, launching_agent, platform

NATS = {"plugins.invocation.transport": "nats"}


@pytest.mark.slow
async def test_pexec_over_the_nats_transport(tmp_path: Path) -> None:
    async with platform(tmp_path, **NATS) as p, launching_agent(p, tmp_path / "instances"):
        fid, _ = await deployed(p.admin)
        for n in range(5):
            reply = await p.key.post(f"/v2/nvcf/pexec/functions/{fid}", {"message": f"m{n}", "repeats": 2})
            assert reply.status == 200, reply.body
            assert reply.json["message"] == f"m{n}m{n}"
            assert reply.headers["NVCF-STATUS"] == "fulfilled"


async def _connect(url: str, token: str, errors: list[str], **options: Any) -> NatsClient:
    async def on_error(err: Exception) -> None:
        errors.append(str(err))

    return await raw_client(
        url,
        token=token,
        error_cb=on_error,
        allow_reconnect=False,
        max_reconnect_attempts=0,
        connect_timeout=5,
        **options,
    )


@pytest.mark.slow
async def test_worker_credentials_reach_only_their_version(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The auth callout grants a session token its version's durable and cancels, and nothing else."""
    caplog.set_level(logging.INFO, logger="nvcf_mono.plugin.nats_auth")
    async with platform(tmp_path, **NATS) as p, launching_agent(p, tmp_path / "instances"):
        fid, vid = await deployed(p.admin)
        other = str(uuid.uuid4())
        signer = TokenSigner(p.host.services.get(KEYRING).token_key)
        stream, durable = subjects.request_stream("ncp", vid), subjects.worker_durable("ncp", vid)
        claims = {
            "fid": fid,
            "fvid": vid,
            "nca": "x",
            "rid": "r",
            "iid": "i",
            "tr": "nats",
            "st": stream,
            "du": durable,
            "ib": subjects.worker_inbox(uuid.uuid4().hex),
        }
        token = envelope("APP", "worker", signer.mint(permissions.WORKER_SESSION, claims, ttl=60))
        url = p.host.endpoints.nats_url.split("@")[-1]
        if not url.startswith("nats://"):
            url = "nats://" + url
        errors: list[str] = []
        nc = await _connect(url, token, errors, inbox_prefix=claims["ib"])
        try:
            # Allowed: its own cancels and pulling from its own durable (no messages waiting: a timeout).
            await nc.subscribe(subjects.cancel_subject(vid))
            js = nc.jetstream()
            sub = await js.pull_subscribe_bind(durable, stream)
            with pytest.raises(nats.errors.TimeoutError):
                await sub.fetch(1, timeout=0.5)
            assert errors == []
            # Denied: another version's cancels, the control subjects, the JetStream admin API.
            await nc.subscribe(subjects.cancel_subject(other))
            await nc.publish("$JS.API.STREAM.LIST", b"")
            await nc.publish(f"rq.ncp.{vid}.{uuid.uuid4()}", b"forged request")
            await nc.flush(timeout=5)

            async def denied() -> bool:
                return sum("permissions violation" in e.lower() for e in errors) >= 3

            await wait_for(denied, timeout=10, what=f"three permission violations: {errors}")
            assert any(subjects.cancel_subject(other) in e for e in errors), errors
        finally:
            await nc.close()
        # A forged or foreign token gets no connection at all, nor a session claiming a wider scope.
        forged = envelope("APP", "worker", TokenSigner(b"k" * 32).mint(permissions.WORKER_SESSION, claims))
        wider = [
            envelope("APP", "worker", signer.mint(permissions.WORKER_SESSION, {**claims, **change}, ttl=60))
            for change in ({"ib": "_INBOX"}, {"ib": f"{subjects.WORKER_INBOX_ROOT}.*"}, {"du": ">"}, {"st": "a.b"})
        ]
        without_inbox = {k: v for k, v in claims.items() if k != "ib"}
        old = envelope("APP", "worker", signer.mint(permissions.WORKER_SESSION, without_inbox, ttl=60))
        for bad in (forged, envelope("APP", "nobody", "x"), "not an envelope", *wider, old, *[forged] * 10):
            with pytest.raises(Exception, match=r"(?i)authorization"):
                await _connect(url, bad, [])
    # Anyone who reaches the NATS port can try as often as they like: the log says so in a few lines.
    refusals = [r for r in caplog.records if "refused NATS connection" in r.getMessage()]
    assert len(refusals) == 5, [r.getMessage() for r in refusals]


@pytest.mark.slow
async def test_a_draining_worker_acks_what_it_pulled_before_it_lets_go_of_nats(tmp_path: Path) -> None:
    """SIGTERM to a nats-transport worker while it serves a call: the call is answered, and the request
    is acked (gone from its stream at once), not left for redelivery after ack_wait."""
    instances = tmp_path / "instances"
    async with platform(tmp_path, **NATS) as p, launching_agent(p, instances):
        fid, vid = await deployed(p.admin)
        url = f"/v2/nvcf/pexec/functions/{fid}"
        assert (await p.key.post(url, {"message": "warm"})).status == 200
        region = p.host.settings.node.region
        stream = p.bus.stream(subjects.request_stream(region, vid))
        durable = subjects.worker_durable(region, vid)
        answers: list[Any] = []

        async def call() -> None:
            answers.append(await p.key.post(url, {"message": "slow", "delay": 1.5}))

        async def pulled() -> bool:
            return (await stream.consumer_info(durable)).num_ack_pending == 1

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            await wait_for(pulled, timeout=10, what="the call pulled by the worker")
            await anyio.sleep(0.3)  # into its 1.5 s at the function
            (worker,) = [pid for pid in processes_under(instances) if b"nvcf_mono\0worker" in Process(pid).cmdline()]
            os.kill(worker, signal.SIGTERM)
        (answer,) = answers
        assert answer.status == 200 and answer.json["message"] == "slow", answer.body

        async def acked() -> bool:
            return (await stream.info()).messages == 0

        await wait_for(acked, timeout=10, what="the request acked (ack_wait is 30 s)")

        async def exited() -> bool:
            return worker not in processes_under(instances)

        await wait_for(exited, timeout=15, what="the worker's exit")
        logs = "".join(path.read_text(errors="replace") for path in instances.glob("*.log"))
        assert "Traceback" not in logs and "ERROR" not in logs, logs[-3000:]
