"""Size limits that hold, payloads that do not outlive their requests, and a full store that loses nothing.

One limit per route, enforced with a 413 before anything is stored; a large request body is deleted
once its request has its answer; a store that fills up answers 503 with Retry-After, and every
request it accepted before is still answered exactly once.
"""

from __future__ import annotations

import io
import json
import socket
from pathlib import Path

import anyio
import pytest

from nvcf_mono.contracts import buckets
from nvcf_mono.testing.platform import Api, Reply, wait_for
from nvcf_mono.testing.running import deployed, launching_agent, platform
from tests.chaos.tally import Tally

pytestmark = pytest.mark.chaos

MiB = 1024 * 1024


def _raw_post(base: str, path: str, token: str, content_length: int) -> tuple[int, bytes]:
    """Announce a body of ``content_length`` bytes, send none of it, and read the answer."""
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(
            (
                f"POST {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n"
                f"Content-Type: application/octet-stream\r\nContent-Length: {content_length}\r\n\r\n"
            ).encode()
        )
        data = b""
        while b"\r\n\r\n" not in data or len(data) < data.index(b"\r\n\r\n") + 4 + 20:
            part = sock.recv(65536)
            if not part:
                break
            data += part
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


async def _post_big(api: Api, path: str, doc: dict[str, object], headers: dict[str, str] | None = None) -> Reply:
    """A JSON POST of a large body (streamed from a buffer, as aiohttp wants large bodies)."""
    hdrs = {"Authorization": f"Bearer {api.token}", "Content-Type": "application/json", **(headers or {})}
    with anyio.fail_after(api.timeout):
        async with api.session.post(api.base + path, data=io.BytesIO(json.dumps(doc).encode()), headers=hdrs) as resp:
            return Reply(status=resp.status, headers=dict(resp.headers), body=await resp.read())


@pytest.mark.slow
async def test_an_oversized_body_is_refused_before_it_is_stored(tmp_path: Path) -> None:
    async with (
        platform(tmp_path, **{"plugins.invocation.max_request_body": "2MiB"}) as p,
        launching_agent(p, tmp_path / "instances"),
    ):
        fid, _ = await deployed(p.admin)
        payloads = p.bus.objects(buckets.PAYLOADS.name)
        path = f"/v2/nvcf/pexec/functions/{fid}"
        # Announced too large: 413 at once, without the body being sent.
        status, body = await anyio.to_thread.run_sync(_raw_post, p.key.base, path, p.key.token, 100 * MiB)
        assert status == 413, body
        assert b"max_request_body" in body and b'"status": 413' in body
        # Too large without a Content-Length (chunked): 413 once the limit is passed, nothing kept.

        async def chunks() -> object:
            for _ in range(4):
                yield b"x" * MiB

        async with p.key.session.post(
            p.key.base + path, data=chunks(), headers={"Authorization": f"Bearer {p.key.token}"}
        ) as resp:
            assert resp.status == 413
            assert resp.headers["Content-Type"] == "application/problem+json"
        assert await payloads.list() == []
        # Within the limit: served, and its stored body is gone once it has its answer.
        big = {"message": "ok", "pad": "y" * (MiB + 1)}
        reply = await _post_big(p.key, path, big)
        assert reply.status == 200 and reply.json["message"] == "ok"

        async def emptied() -> bool:
            return await payloads.list() == []

        await wait_for(emptied, timeout=10, what="the request body to be deleted")


@pytest.mark.slow
async def test_a_full_store_answers_503_and_loses_nothing_it_accepted(tmp_path: Path) -> None:
    tally = Tally("full-store")
    settings = {
        "embedded_nats.max_file_store": "48MiB",
        "plugins.invocation.queue_max_bytes": "1GiB",
    }
    async with platform(tmp_path, **settings) as p, launching_agent(p, tmp_path / "instances"):
        fid, _ = await deployed(p.admin, concurrency=1)
        path = f"/v2/nvcf/pexec/functions/{fid}"
        patient = Api(p.key.session, p.key.base, p.key.token, timeout=60)
        accepted: dict[str, str] = {}  # request id -> token
        refused = 0
        slots = anyio.Semaphore(16)

        async def submit(i: int) -> None:
            nonlocal refused
            async with slots:
                if refused >= 5:
                    return
                token = f"r{i}"
                tally.sent += 1
                body = {"message": token, "delay": 0.25, "pad": "z" * (2 * MiB)}  # served slower than sent
                reply = await _post_big(patient, path, body, headers={"NVCF-POLL-SECONDS": "1"})
                if reply.status == 503:
                    assert reply.headers["Content-Type"] == "application/problem+json"
                    assert "message store is full" in reply.detail and reply.headers.get("Retry-After")
                    refused += 1
                    return
                tally.accepted.add(token)
                if reply.status == 200:
                    tally.answered(token, right=reply.json["message"] == token)
                    return
                assert reply.status == 202, (reply.status, reply.body)
                accepted[reply.headers["NVCF-REQID"]] = token

        async with anyio.create_task_group() as tg:
            for i in range(200):
                tg.start_soon(submit, i)
        assert refused, "the store never filled up"

        async def follow(request_id: str, token: str) -> None:
            while True:
                reply = await patient.get(f"/v2/nvcf/pexec/status/{request_id}", headers={"NVCF-POLL-SECONDS": "10"})
                if reply.status == 202:
                    continue
                if reply.status != 200:
                    tally.failed(reply.status, reply.body.decode(errors="replace"))
                tally.answered(token, right=reply.status == 200 and json.loads(reply.body)["message"] == token)
                return

        with anyio.fail_after(240):
            async with anyio.create_task_group() as tg:
                for request_id, token in accepted.items():
                    tg.start_soon(follow, request_id, token)
        tally.report(refused=refused)
        tally.assert_exactly_once()
        # Drained, the store takes new requests again.
        again = await patient.post(path, {"message": "again"})
        assert again.status == 200 and again.json["message"] == "again"
