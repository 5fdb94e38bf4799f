"""Large responses: files a function writes into NVCF-LARGE-OUTPUT-DIR come back zipped with its body, behind a 302.

Real processes: the platform on its own NATS, an instance (the test echo server and ``nvcf-mono worker``)
started by a scripted agent. The ``mirror`` function writes the files its request asks for.
"""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import aiohttp
import pytest

from nvcf_mono.testing.platform import Reply, wait_for
from nvcf_mono.testing.running import ECHO_FUNCTION, Platform, deployed, launching_agent, platform
from tests.support.tampering import altered

pytestmark = pytest.mark.slow

MIRROR = {**ECHO_FUNCTION, "name": "mirror", "inferenceUrl": "/echo-request"}


async def post(p: Platform, path: str, body: Any, **headers: str) -> Reply:
    """A call that does not follow redirects (the 302 is what is checked)."""
    async with p.key.session.post(
        p.key.base + path,
        json=body,
        headers={"Authorization": f"Bearer {p.key.token}", **headers},
        allow_redirects=False,
    ) as resp:
        return Reply(status=resp.status, headers=dict(resp.headers), body=await resp.read())


async def download(url: str) -> tuple[int, bytes, str]:
    async with aiohttp.ClientSession() as s, s.get(url) as resp:  # no bearer: the link is the credential
        return resp.status, await resp.read(), resp.headers.get("Content-Type", "")


async def test_outputs_come_back_zipped_with_the_body_behind_a_302(tmp_path: Path) -> None:
    async with platform(tmp_path) as p, launching_agent(p, tmp_path / "instances"):
        fid, _ = await deployed(p.admin, MIRROR)
        outputs = {"image.png": "PNG bytes", "sub/mask.txt": "mask"}
        # A link to a file the worker may read and the function may not must never be packaged.
        links = {"stolen": "/proc/self/environ", "up": ".."}
        asked = {"answer": {"body": "the answer", "files": outputs, "links": links}}
        reply = await post(p, f"/v2/nvcf/pexec/functions/{fid}", asked)
        assert reply.status == 302, reply.body
        assert reply.headers["NVCF-STATUS"] == "fulfilled" and reply.headers["Content-Length"] == "0"
        rid, location = reply.headers["NVCF-REQID"], reply.headers["Location"]
        assert location.startswith(f"{p.key.base}/v2/nvcf/pexec/large-responses/{rid}?")

        status, data, content_type = await download(location)
        assert status == 200 and content_type == "application/zip"
        archive = zipfile.ZipFile(io.BytesIO(data))
        assert sorted(archive.namelist()) == sorted([f"{rid}.response", "image.png", "sub/mask.txt"])
        assert archive.read(f"{rid}.response") == b"the answer"
        assert archive.read("image.png") == b"PNG bytes" and archive.read("sub/mask.txt") == b"mask"

        # The link is its own authorization: altered, expired or for another request, it is refused.
        parts = urlsplit(location)
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        base = f"{parts.scheme}://{parts.netloc}{parts.path}"
        for changed in ({"signature": altered(query["signature"])}, {"expires": str(int(query["expires"]) + 1)}):
            status, _, _ = await download(f"{base}?{urlencode({**query, **changed})}")
            assert status == 403, changed
        status, _, _ = await download(f"{base.replace(rid, '0' * 8 + rid[8:])}?{parts.query}")
        assert status == 403
        assert (await download(base))[0] == 403

        # exec names the link as responseReference (200, as NVCF turns a 302 into).
        wrapped = await post(p, f"/v2/nvcf/exec/functions/{fid}", {"requestBody": asked})
        doc = wrapped.json
        assert wrapped.status == 200 and doc["status"] == "fulfilled"
        assert doc["responseReference"].startswith(f"{p.key.base}/v2/nvcf/pexec/large-responses/{doc['reqId']}?")

        # An error goes to the caller as it is, files or not.
        failed = await post(p, f"/v2/nvcf/pexec/functions/{fid}", {"answer": {"status": 500, "files": {"x": "y"}}})
        assert failed.status == 500 and "Location" not in failed.headers

        # Without files: the body as it is.
        plain = await post(p, f"/v2/nvcf/pexec/functions/{fid}", {"answer": {"body": "small"}})
        assert plain.status == 200 and plain.body == b"small"

        # A request that outlives its poll window: the poll gets the 302.
        slow = {"answer": {"body": "late", "delay": 2.5, "files": {"out.bin": "x"}}}
        waiting = await post(p, f"/v2/nvcf/pexec/functions/{fid}", slow, **{"NVCF-POLL-SECONDS": "1"})
        assert waiting.status == 202
        status_path = f"/v2/nvcf/pexec/status/{waiting.headers['NVCF-REQID']}"

        async def polled() -> Reply | None:
            async with p.key.session.get(
                p.key.base + status_path,
                headers={"Authorization": f"Bearer {p.key.token}", "NVCF-POLL-SECONDS": "1"},
                allow_redirects=False,
            ) as resp:
                reply = Reply(status=resp.status, headers=dict(resp.headers), body=await resp.read())
                return None if reply.status == 202 else reply

        done = await wait_for(polled, timeout=30, what="the slow request's answer")
        assert done.status == 302
        late = zipfile.ZipFile(io.BytesIO((await download(done.headers["Location"]))[1]))
        assert sorted(late.namelist()) == sorted([f"{waiting.headers['NVCF-REQID']}.response", "out.bin"])

        # Compatibility mode off (a stream, or the header): bytes as they are, nothing packaged.
        raw = await post(
            p,
            f"/v2/nvcf/pexec/functions/{fid}",
            {"answer": {"body": "raw", "files": {"x.bin": "x"}}},
            **{"nvcf-feature-disable-worker-compatibility": "true"},
        )
        assert raw.status == 200 and raw.body == b"raw"


async def test_a_large_response_over_the_limit_is_a_clear_500_and_nothing_is_kept(tmp_path: Path) -> None:
    async with (
        platform(tmp_path, **{"plugins.invocation.max_large_response": "4096"}) as p,
        launching_agent(p, tmp_path / "instances"),
    ):
        fid, _ = await deployed(p.admin, MIRROR)
        big = {"answer": {"body": "b", "files": {"huge.bin": "x" * 64 * 1024}}}
        reply = await post(p, f"/v2/nvcf/pexec/functions/{fid}", big)
        assert reply.status == 500 and reply.headers["Content-Type"] == "application/problem+json"
        detail = reply.json["detail"]
        assert "exceeds the limit of 4096 bytes" in detail and "max_large_response" in detail
        # The next one, within the limit, works: the instance is fine.
        small = await post(p, f"/v2/nvcf/pexec/functions/{fid}", {"answer": {"body": "b", "files": {"s": "x"}}})
        assert small.status == 302


async def test_a_body_over_the_direct_limit_comes_back_zipped_behind_a_302(tmp_path: Path) -> None:
    async with platform(tmp_path) as p, launching_agent(p, tmp_path / "instances"):
        echo, _ = await deployed(p.admin, ECHO_FUNCTION)
        mirror, _ = await deployed(p.admin, MIRROR)
        # The function is told the limit (a caller's copy of the header is replaced).
        told = await post(p, f"/v2/nvcf/pexec/functions/{mirror}", {}, **{"NVCF-MAX-RESPONSE-SIZE-BYTES": "1"})
        assert told.json["headers"]["NVCF-MAX-RESPONSE-SIZE-BYTES"] == str(5 * 1024 * 1024)

        kib = "k" * 1024
        over = await post(p, f"/v2/nvcf/pexec/functions/{echo}", {"message": kib, "repeats": 5 * 1024 + 1})
        assert over.status == 302, over.body[:300]
        rid = over.headers["NVCF-REQID"]
        status, data, _ = await download(over.headers["Location"])
        assert status == 200
        archive = zipfile.ZipFile(io.BytesIO(data))
        assert archive.namelist() == [f"{rid}.response"]
        assert len(json.loads(archive.read(f"{rid}.response"))["message"]) == (5 * 1024 + 1) * 1024

        # At the limit or under it, and whenever compatibility mode is off, the body comes back itself.
        under = await post(p, f"/v2/nvcf/pexec/functions/{echo}", {"message": kib, "repeats": 5 * 1024 - 1})
        assert under.status == 200 and len(under.json["message"]) == (5 * 1024 - 1) * 1024
        raw = await post(
            p,
            f"/v2/nvcf/pexec/functions/{echo}",
            {"message": kib, "repeats": 5 * 1024 + 1},
            **{"NVCF-Feature-Disable-Worker-Compatibility": "true"},
        )
        assert raw.status == 200 and len(raw.json["message"]) == (5 * 1024 + 1) * 1024

        # A body of unknown length (chunked) is read to learn its size, as NVCF's compatibility mode does:
        # over the limit it is zipped too, under it it comes back whole; an event stream goes as it comes.
        chunked_over = await post(
            p, f"/v2/nvcf/pexec/functions/{echo}", {"message": kib, "repeats": 5 * 1024 + 1, "chunked": True}
        )
        assert chunked_over.status == 302, chunked_over.body[:300]
        status, data, _ = await download(chunked_over.headers["Location"])
        archive = zipfile.ZipFile(io.BytesIO(data))
        name = f"{chunked_over.headers['NVCF-REQID']}.response"
        assert status == 200 and len(json.loads(archive.read(name))["message"]) == (5 * 1024 + 1) * 1024
        chunked_under = await post(
            p, f"/v2/nvcf/pexec/functions/{echo}", {"message": kib, "repeats": 5 * 1024 - 1, "chunked": True}
        )
        assert chunked_under.status == 200 and len(chunked_under.json["message"]) == (5 * 1024 - 1) * 1024
        assert chunked_under.headers["Content-Length"] == str(len(chunked_under.body))  # read whole, then sent
        events = await post(
            p, f"/v2/nvcf/pexec/functions/{echo}", {"message": kib, "repeats": 5 * 1024 + 1, "stream": True}
        )
        assert events.status == 200 and events.body.count(b"data: ") == 5 * 1024 + 1
