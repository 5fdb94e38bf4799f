"""Assets: create, upload and download through pre-signed links on the platform, list, delete."""

from __future__ import annotations

import hashlib
import hmac
import io
import os
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

import anyio
import pytest

from nvcf_mono.auth.secret import KEYRING, b64u
from nvcf_mono.contracts import buckets
from nvcf_mono.testing.platform import Reply, wait_for
from nvcf_mono.testing.running import CONTAINER_FUNCTION, deployed, launching_agent, other_account_key
from tests.support.tampering import altered

from .conftest import Platform, platform

ASSETS = "/v2/nvcf/assets"
MiB = 1024 * 1024


async def raw(
    p: Platform,
    method: str,
    url: str,
    *,
    data: bytes | AsyncIterator[bytes] | None = None,
    headers: Mapping[str, str] | None = None,
    timeout: float = 60.0,
) -> Reply:
    """A request to an absolute URL (a pre-signed link) with no Authorization header."""
    body = io.BytesIO(data) if isinstance(data, bytes) else data  # raw bytes this large warn in aiohttp
    with anyio.fail_after(timeout):
        async with p.anonymous.session.request(method, url, data=body, headers=dict(headers or {})) as resp:
            reply = Reply(status=resp.status, headers=dict(resp.headers), body=await resp.read())
    checker = p.anonymous.checker
    content_type = reply.headers.get("Content-Type", "")
    if checker is not None and not (method == "GET" and reply.status == 200):  # downloads: the asset's own type
        checker.check(
            method, urlsplit(url).path, reply.status, content_type, reply.json if "json" in content_type else None
        )
    return reply


async def chunks(data: bytes, size: int = 64 * 1024) -> AsyncIterator[bytes]:
    """``data`` as a body of unknown length (chunked transfer encoding)."""
    for start in range(0, len(data), size):
        yield data[start : start + size]


async def create(p: Platform, content_type: str = "application/octet-stream", description: str = "input") -> dict:
    reply = await p.key.post(ASSETS, {"contentType": content_type, "description": description})
    assert reply.status == 200, reply.body
    return reply.json  # type: ignore[no-any-return]


async def download_url(p: Platform, asset_id: str) -> str:
    reply = await p.key.get(f"{ASSETS}/{asset_id}/content-redirect")
    assert reply.status == 200, reply.body
    return str(reply.json["presignedUrl"])


def with_query(url: str, **changes: str | None) -> str:
    parts = urlsplit(url)
    query = {k: v[0] for k, v in parse_qs(parts.query).items()}
    for key, value in changes.items():
        if value is None:
            query.pop(key, None)
        else:
            query[key] = value
    return urlunsplit(parts._replace(query=urlencode(query)))


async def test_a_20_mib_asset_round_trips_through_the_pre_signed_links(tmp_path: Path) -> None:
    async with platform(tmp_path) as p:
        created = await create(p, "image/png", "a large input")
        asset_id = created["assetId"]
        assert created["contentType"] == "image/png" and created["description"] == "a large input"
        upload = created["uploadUrl"]
        assert upload.startswith(f"{p.host.endpoints.url.rstrip('/')}{ASSETS}/{asset_id}/upload?")
        assert {"expires", "signature"} <= set(parse_qs(urlsplit(upload).query))

        listed = await p.key.get(ASSETS)
        assert listed.status == 200
        assert [a["assetId"] for a in listed.json["assets"]] == [asset_id]
        assert "size" not in listed.json["assets"][0]

        not_yet = await raw(p, "GET", await download_url(p, asset_id))
        assert not_yet.status == 404 and "upload" in not_yet.json["detail"]

        content = os.urandom(20 * MiB)
        put = await raw(p, "PUT", upload, data=content, headers={"Content-Type": "image/png"})
        assert put.status == 200, put.body
        assert put.body == b""

        meta = await p.key.get(f"{ASSETS}/{asset_id}")
        assert meta.status == 200
        asset = meta.json["asset"]
        assert asset["size"] == 20 * MiB and asset["uploadedAt"] and asset["createdAt"]

        got = await raw(p, "GET", await download_url(p, asset_id))
        assert got.status == 200
        assert got.headers["Content-Type"] == "image/png"
        assert int(got.headers["Content-Length"]) == 20 * MiB
        assert hashlib.sha256(got.body).hexdigest() == hashlib.sha256(content).hexdigest()

        # A link stays usable until it expires: a second upload (streamed, no length) replaces the content.
        smaller = os.urandom(3 * MiB + 17)
        again = await raw(p, "PUT", upload, data=chunks(smaller), headers={"Content-Type": "image/png"})
        assert again.status == 200, again.body
        got = await raw(p, "GET", await download_url(p, asset_id))
        assert hashlib.sha256(got.body).hexdigest() == hashlib.sha256(smaller).hexdigest()
        assert (await p.key.get(f"{ASSETS}/{asset_id}")).json["asset"]["size"] == len(smaller)

        link = await download_url(p, asset_id)
        deleted = await p.key.delete(f"{ASSETS}/{asset_id}")
        assert deleted.status == 204
        assert (await p.key.get(f"{ASSETS}/{asset_id}")).status == 404
        assert (await p.key.delete(f"{ASSETS}/{asset_id}")).status == 404
        assert (await raw(p, "GET", link)).status == 404
        assert await p.bus.objects(buckets.ASSET_CONTENT.name).info(f"nvcf-default/{asset_id}") is None
        assert (await p.key.get(ASSETS)).json["assets"] == []
        gone = await raw(p, "PUT", upload, data=b"x", headers={"Content-Type": "image/png"})
        assert gone.status == 404


async def test_links_are_refused_when_altered_swapped_or_expired(tmp_path: Path) -> None:
    async with platform(tmp_path) as p:
        created = await create(p, "text/plain; charset=utf-8")
        asset_id, upload = created["assetId"], created["uploadUrl"]
        ok = {"Content-Type": "text/plain; charset=utf-8"}

        async def refused(url: str, method: str = "PUT") -> str:
            reply = await raw(p, method, url, data=b"hello" if method == "PUT" else None, headers=ok)
            assert reply.status == 403, (url, reply.status, reply.body)
            assert reply.headers["Content-Type"].startswith("application/problem+json")
            return str(reply.json["detail"])

        sig = parse_qs(urlsplit(upload).query)["signature"][0]
        assert "signature" in await refused(with_query(upload, signature=altered(sig)))
        expires = int(parse_qs(urlsplit(upload).query)["expires"][0])
        assert "signature" in await refused(with_query(upload, expires=str(expires + 3600)))
        assert "lacks" in await refused(with_query(upload, signature=None))
        assert "lacks" in await refused(with_query(upload, expires=None))
        assert "unix time" in await refused(with_query(upload, expires="tomorrow"))
        # The same signature on another asset, or an upload link used to download, does not pass.
        other = (await create(p))["assetId"]
        assert "signature" in await refused(upload.replace(asset_id, other))
        assert "signature" in await refused(upload.replace("/upload?", "/download?"), "GET")

        # A correctly signed link past its expiry (signed here with the platform's link key).
        key = p.host.services.get(KEYRING).secret.derive("asset-links/v1")
        past = int(time.time()) - 5
        signed = b64u(hmac.digest(key, f"nvcf-asset-link\nupload\n{asset_id}\n{past}".encode(), "sha256"))
        assert "expired" in await refused(with_query(upload, expires=str(past), signature=signed))
        future = int(time.time()) + 60
        signed = b64u(hmac.digest(key, f"nvcf-asset-link\nupload\n{asset_id}\n{future}".encode(), "sha256"))
        fresh = with_query(upload, expires=str(future), signature=signed)

        # A valid link still needs the content type the asset was created with.
        wrong = await raw(p, "PUT", fresh, data=b"hello", headers={"Content-Type": "image/png"})
        assert wrong.status == 400 and "text/plain; charset=utf-8" in wrong.json["detail"]
        missing = await raw(p, "PUT", fresh, data=b"hello", headers={"Content-Type": ""})
        assert missing.status == 400
        spaced = await raw(p, "PUT", fresh, data=b"hello", headers={"Content-Type": "Text/Plain;charset=UTF-8"})
        assert spaced.status == 200, spaced.body
        got = await raw(p, "GET", await download_url(p, asset_id))
        assert got.status == 200 and got.body == b"hello"
        assert got.headers["Content-Type"] == "text/plain; charset=utf-8"

        # The links are documented, without a bearer.
        doc = (await p.anonymous.get("/v3/openapi")).json
        put_op = doc["paths"][f"{ASSETS}/{{assetId}}/upload"]["put"]
        get_op = doc["paths"][f"{ASSETS}/{{assetId}}/download"]["get"]
        assert put_op["security"] == [] and get_op["security"] == []
        assert "requestBody" in put_op and "200" in get_op["responses"]
        assert {"403", "404", "413"} <= set(put_op["responses"])


async def test_uploads_over_the_size_limit_are_refused_and_keep_the_earlier_content(tmp_path: Path) -> None:
    async with platform(tmp_path, **{"plugins.control.max_asset_size": "1024"}) as p:
        created = await create(p)
        upload = created["uploadUrl"]
        octets = {"Content-Type": "application/octet-stream"}
        exact = os.urandom(1024)
        assert (await raw(p, "PUT", upload, data=exact, headers=octets)).status == 200

        declared = await raw(p, "PUT", upload, data=os.urandom(1025), headers=octets)
        assert declared.status == 413 and "1024" in declared.json["detail"]
        streamed = await raw(p, "PUT", upload, data=chunks(os.urandom(8192), 512), headers=octets)
        assert streamed.status == 413

        got = await raw(p, "GET", await download_url(p, created["assetId"]))
        assert got.status == 200 and got.body == exact
        assert (await p.key.get(f"{ASSETS}/{created['assetId']}")).json["asset"]["size"] == 1024


async def test_an_accounts_assets_together_are_held_to_its_quota(tmp_path: Path) -> None:
    async with platform(tmp_path, **{"plugins.control.max_account_asset_bytes": str(3 * MiB)}) as p:
        octets = {"Content-Type": "application/octet-stream"}
        first = await create(p)
        assert (await raw(p, "PUT", first["uploadUrl"], data=os.urandom(2 * MiB), headers=octets)).status == 200
        second = await create(p)
        declared = await raw(p, "PUT", second["uploadUrl"], data=os.urandom(2 * MiB), headers=octets)
        assert declared.status == 413, declared.body
        assert f"other assets hold {2 * MiB}" in declared.json["detail"]
        streamed = await raw(p, "PUT", second["uploadUrl"], data=chunks(os.urandom(2 * MiB)), headers=octets)
        assert streamed.status == 413
        assert (await raw(p, "PUT", second["uploadUrl"], data=os.urandom(MiB), headers=octets)).status == 200
        # New content for an asset frees what it replaces.
        assert (await raw(p, "PUT", first["uploadUrl"], data=os.urandom(2 * MiB), headers=octets)).status == 200
        # The quota is the account's: another account's assets have their own.
        other = p.api(await other_account_key(p, "quota-neighbour"))
        made = await other.post(ASSETS, {"contentType": "application/octet-stream", "description": "theirs"})
        assert made.status == 200, made.body
        theirs = await raw(p, "PUT", made.json["uploadUrl"], data=os.urandom(3 * MiB), headers=octets)
        assert theirs.status == 200, theirs.body


async def test_uploads_made_at_once_are_held_to_the_accounts_quota_together(tmp_path: Path) -> None:
    """Each upload used to see only the finished assets: six at once passed a quota that holds two."""
    async with platform(tmp_path, **{"plugins.control.max_account_asset_bytes": str(3 * MiB)}) as p:
        octets = {"Content-Type": "application/octet-stream"}
        links = [(await create(p, description=f"{n}"))["uploadUrl"] for n in range(6)]
        statuses: list[int] = []

        async def upload(n: int, url: str) -> None:
            size = 3 * MiB // 2
            body = chunks(os.urandom(size)) if n % 2 else os.urandom(size)  # streamed and declared
            put = await raw(p, "PUT", url, data=body, headers=octets)
            assert put.status in (200, 413), put.body
            if put.status == 413:
                assert "the account's assets may hold" in put.json["detail"], put.body
            statuses.append(put.status)

        async with anyio.create_task_group() as tg:
            for n, url in enumerate(links):
                tg.start_soon(upload, n, url)
        assert 1 <= statuses.count(200) <= 2 and statuses.count(413) >= 4, statuses
        listed = await p.key.get(ASSETS)
        assert sum(a.get("size") or 0 for a in listed.json["assets"]) <= 3 * MiB, listed.json
        assert len(p.host.plugin("control").ctl.asset_uploads) == 0  # nothing kept once the uploads are done


@pytest.mark.slow
async def test_uploads_leave_the_store_room_for_everyones_invocations(tmp_path: Path) -> None:
    """One account's uploads never fill the message store: its reserve stays for queued requests."""
    settings = {"embedded_nats.max_file_store": str(64 * MiB), "plugins.control.max_account_asset_bytes": "0"}
    async with platform(tmp_path, **settings) as p, launching_agent(p, tmp_path / "instances"):
        fid, _ = await deployed(p.admin)
        hostile = p.api(await other_account_key(p, "hoarder"))
        octets = {"Content-Type": "application/octet-stream"}
        refusals = 0
        size = 16 * MiB
        while size >= 64 * 1024:  # fill the room for uploads, in smaller pieces once a piece is refused
            made = await hostile.post(ASSETS, {"contentType": "application/octet-stream", "description": f"{size}"})
            assert made.status == 200, made.body
            body = chunks(os.urandom(size)) if refusals % 2 else os.urandom(size)  # streamed and declared
            put = await raw(p, "PUT", made.json["uploadUrl"], data=body, headers=octets)
            if put.status != 200:
                assert put.status == 507 and "no room for this upload" in put.json["detail"], put.body
                refusals += 1
                size //= 2
        assert refusals >= 8
        # A request body too large for its message is an upload too: held to the same room.
        big = await p.key.post(f"/v2/nvcf/pexec/functions/{fid}", {"message": "x" * (20 * MiB)})
        assert big.status == 507 and "no room for a body this large" in big.json["detail"], big.body
        # So is a large answer kept for its caller to poll: the caller hears why it was not kept.
        body = {"message": "r" * 200, "repeats": 5000, "delay": 3}  # a 1 MB answer, after the poll window
        slow = await p.key.post(f"/v2/nvcf/pexec/functions/{fid}", body, headers={"NVCF-POLL-SECONDS": "1"})
        assert slow.status == 202, slow.body

        async def answered() -> Reply | None:
            polled = await p.key.get(f"/v2/nvcf/pexec/status/{slow.headers['NVCF-REQID']}")
            return None if polled.status == 202 else polled

        kept = await wait_for(answered, timeout=30, what="the slow call's answer")
        assert kept.status == 507 and "too large to keep" in kept.json["detail"], kept.body
        usage = await p.bus.usage()
        assert usage.storage < 0.8 * 64 * MiB, usage  # what was refused was not kept
        for n in range(20):  # everyone else's work still fits
            answer = await p.key.post(f"/v2/nvcf/pexec/functions/{fid}", {"message": f"still here {n}"})
            assert answer.status == 200, answer.body
        assert (await p.admin.post("/v2/nvcf/functions", CONTAINER_FUNCTION)).status == 200


async def test_assets_belong_to_their_account(tmp_path: Path) -> None:
    async with platform(tmp_path) as p:
        created = await create(p)
        asset_id = created["assetId"]
        other = p.api(await other_account_key(p, "acct-two"))
        for reply in (
            await other.get(f"{ASSETS}/{asset_id}"),
            await other.get(f"{ASSETS}/{asset_id}/content-redirect"),
            await other.delete(f"{ASSETS}/{asset_id}"),
        ):
            assert reply.status == 404, reply.body
        assert (await other.get(ASSETS)).json["assets"] == []
        mine = await other.post(ASSETS, {"contentType": "application/json", "description": "theirs"})
        assert mine.status == 200
        assert [a["assetId"] for a in (await p.key.get(ASSETS)).json["assets"]] == [asset_id]

        # A super admin reaches any account's assets through the cross-account twin.
        twin = await p.admin.get(f"/v2/nvcf/accounts/acct-two/assets/{mine.json['assetId']}")
        assert twin.status == 200 and twin.json["asset"]["description"] == "theirs"
        assert (await p.admin.get(f"/v2/nvcf/accounts/acct-two/assets/{asset_id}")).status == 404
        assert (await p.key.get(f"{ASSETS}/not-a-uuid")).status == 404


async def test_asset_requests_are_validated_and_scoped(tmp_path: Path) -> None:
    async with platform(tmp_path) as p:
        bad = await p.key.post(ASSETS, {"contentType": "not a type", "description": "x"})
        assert bad.status == 400 and "contentType" in bad.json["detail"]
        missing = await p.key.post(ASSETS, {"contentType": "image/png"})
        assert missing.status == 400 and "description" in missing.json["detail"]
        too_long = await p.key.post(ASSETS, {"contentType": "image/png", "description": "d" * 257})
        assert too_long.status == 400
        assert (await p.anonymous.post(ASSETS, {"contentType": "image/png", "description": "x"})).status == 401
        assert (await p.task_key.post(ASSETS, {"contentType": "image/png", "description": "x"})).status == 403
        assert (await p.task_key.get(ASSETS)).status == 403


@pytest.mark.slow
async def test_uploads_made_at_once_share_the_room_one_look_saw(tmp_path: Path) -> None:
    """A tenant's uploads started together each saw the whole room at their start: together they went
    into the reserve, up to the store's own limit, and everyone's invocations were refused.
    """
    settings = {"embedded_nats.max_file_store": str(64 * MiB), "plugins.control.max_account_asset_bytes": "0"}
    async with platform(tmp_path, **settings) as p, launching_agent(p, tmp_path / "instances"):
        fid, _ = await deployed(p.admin)
        hostile = p.api(await other_account_key(p, "hoarder"))
        octets = {"Content-Type": "application/octet-stream"}
        links = []
        for n in range(6):
            made = await hostile.post(ASSETS, {"contentType": "application/octet-stream", "description": f"{n}"})
            assert made.status == 200, made.body
            links.append(made.json["uploadUrl"])
        statuses: list[int] = []

        async def upload(n: int, url: str) -> None:
            body = chunks(os.urandom(16 * MiB)) if n % 2 else os.urandom(16 * MiB)  # streamed and declared
            put = await raw(p, "PUT", url, data=body, headers=octets)
            assert put.status in (200, 507), put.body
            statuses.append(put.status)

        async with anyio.create_task_group() as tg:
            for n, url in enumerate(links):
                tg.start_soon(upload, n, url)
        assert 1 <= statuses.count(200) <= 3 and statuses.count(507) >= 3, statuses  # 48 MiB of room at most
        usage = await p.bus.usage()
        assert usage.storage < 0.8 * 64 * MiB, usage  # the reserve was kept
        for n in range(20):
            answer = await p.key.post(f"/v2/nvcf/pexec/functions/{fid}", {"message": f"still here {n}"})
            assert answer.status == 200, answer.body
