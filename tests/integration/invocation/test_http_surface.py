"""The invocation plane's HTTP surface beyond pexec: exec, Host routing, input assets, Idempotency-Key, metrics.

Real processes throughout: the platform on its own NATS, and instances launched by a scripted agent
(the test echo server and ``nvcf-mono worker``). The ``mirror`` function answers with the request it
got (``/echo-request``), or with the exact answer its JSON body asks for.
"""

from __future__ import annotations

import gzip
import io
import json
import logging
import re
import uuid
import zlib
from pathlib import Path
from typing import Any

import anyio
import pytest
from aiohttp.test_utils import make_mocked_request
from multidict import CIMultiDict

from nvcf_mono.config.model import LoggingSettings
from nvcf_mono.contracts import subjects
from nvcf_mono.contracts.frames import Request
from nvcf_mono.http.problem import ProblemError
from nvcf_mono.log import configure_logging
from nvcf_mono.planes.invocation.host_routing import target
from nvcf_mono.planes.invocation.http import Timing
from nvcf_mono.planes.invocation.input_assets import parse_references
from nvcf_mono.planes.invocation.plugin import InvocationPlane
from nvcf_mono.testing.platform import Api, Reply, wait_for
from nvcf_mono.testing.running import (
    ECHO_FUNCTION,
    Platform,
    agent,
    deployed,
    launching_agent,
    other_account_key,
    platform,
)

MIRROR = {**ECHO_FUNCTION, "name": "mirror", "inferenceUrl": "/echo-request"}
PROBLEM = "application/problem+json"


def unchecked(api: Api) -> Api:
    """The same caller without the /v3/openapi check: Host-routed answers are the function's, on any path."""
    return Api(api.session, api.base, api.token, timeout=api.timeout)


def answer(**shape: Any) -> dict[str, Any]:
    """An exec body asking the mirror for exactly this answer."""
    return {"requestBody": {"answer": shape}}


async def until_done(api: Api, path: str) -> Reply:
    """Poll a status path (1 s windows) until it stops answering 202."""

    async def probe() -> Reply | None:
        reply = await api.get(path, headers={"NVCF-POLL-SECONDS": "1"})
        return None if reply.status == 202 else reply

    result: Reply = await wait_for(probe, timeout=30, what=f"{path} to finish")
    return result


@pytest.mark.slow
async def test_exec_wraps_the_functions_answer_and_refuses_bad_input(tmp_path: Path) -> None:
    async with platform(tmp_path) as p, launching_agent(p, tmp_path / "instances"):
        fid, vid = await deployed(p.admin, MIRROR)
        url = f"/v2/nvcf/exec/functions/{fid}"

        ok = await p.key.post(url, {"requestBody": {"hello": ["world", 1]}})
        assert ok.status == 200, ok.body
        doc = ok.json
        assert set(doc) == {"reqId", "status", "percentComplete", "response"}  # nulls omitted
        assert doc["reqId"] == ok.headers["NVCF-REQID"] and doc["status"] == "fulfilled"
        assert doc["percentComplete"] == 100 and ok.headers["NVCF-STATUS"] == "fulfilled"
        seen = doc["response"]
        # Re-issued as a pexec of the JSON requestBody to the function's inferenceUrl.
        assert seen["method"] == "POST" and seen["path"] == "/echo-request"
        assert json.loads(seen["body"]) == {"hello": ["world", 1]}
        assert seen["headers"]["Content-Type"] == "application/json"
        assert "Authorization" not in seen["headers"]
        assert set(_timings(ok.headers["Server-Timing"])) == {"intake", "enqueue", "queue", "prepare", "execution"}

        pinned = await p.key.post(
            f"{url}/versions/{vid}", {"requestBody": None, "requestHeader": {"pollDurationSeconds": 30}}
        )
        assert pinned.status == 200, pinned.body
        assert pinned.json["response"]["body"] == "null"

        created = await p.key.post(url, answer(status=201, body='{"id": 7}', contentType="application/json"))
        assert created.status == 201
        assert created.json == {"reqId": created.headers["NVCF-REQID"], "status": "fulfilled", "errorCode": 201}

        moved = await p.key.post(url, answer(status=302, headers={"Location": "https://results.example/r.zip"}))
        assert moved.status == 200, moved.body  # exec answers a 302 with 200
        assert moved.json["responseReference"] == "https://results.example/r.zip"
        assert moved.json["percentComplete"] == 100 and moved.json["status"] == "fulfilled"
        assert "response" not in moved.json

        failed = await p.key.post(url, answer(status=503, body="busy"))
        assert failed.status == 503
        assert failed.json == {"reqId": failed.headers["NVCF-REQID"], "status": "errored", "errorCode": 503}

        text = await p.key.post(url, answer(status=200, body="plain words", contentType="text/plain"))
        assert text.status == 500 and text.headers["Content-Type"].startswith(PROBLEM)
        assert "not JSON" in text.detail and text.headers["NVCF-REQID"]

        # Not of the exec shape, or not JSON at all: 400, before anything is queued.
        for body, needle in (
            ({}, "requestBody"),
            ({"requestHeader": {"pollDurationSeconds": 5}}, "requestBody"),
            ([{"requestBody": 1}], "JSON object"),
            ({"requestBody": 1, "requestHeader": {"pollDurationSeconds": "soon"}}, "pollDurationSeconds"),
            ({"requestBody": 1, "requestHeader": {"pollDurationSeconds": 3601}}, "pollDurationSeconds must be <="),
            ({"requestBody": 1, "requestHeader": {"inputAssetReferences": ["nope"]}}, "inputAssetReferences"),
        ):
            bad = await p.key.post(url, body)
            assert bad.status == 400 and needle in bad.detail, (body, bad.body)
            assert bad.headers["Content-Type"].startswith(PROBLEM)
        broken = await p.key.post(url, data=b'{"requestBody": ', headers={"Content-Type": "application/json"})
        assert broken.status == 400 and "JSON" in broken.detail

        missing = str(uuid.uuid4())
        no_asset = await p.key.post(url, {"requestBody": 1, "requestHeader": {"inputAssetReferences": [missing]}})
        assert no_asset.status == 404 and no_asset.detail == f"NotFound error: failed to find asset {missing}"
        assert (await p.key.post(f"/v2/nvcf/exec/functions/{uuid.uuid4()}", {"requestBody": 1})).status == 404
        pinned = await p.key.post(f"{url}/versions/{missing}", {"requestBody": 1})  # a version it does not have
        assert pinned.status == 404 and f"version '{missing}' not found" in pinned.detail
        assert (await p.anonymous.post(url, {"requestBody": 1})).status == 401
        assert (await p.task_key.post(url, {"requestBody": 1})).status == 403

        # Past the poll window: 202 in the wrapper, then the wrapped result from exec's status poll (once).
        slow = await p.key.post(
            url,
            {
                "requestBody": {"answer": {"delay": 2.5, "body": '{"done": true}', "contentType": "application/json"}},
                "requestHeader": {"pollDurationSeconds": 1},
            },
        )
        assert slow.status == 202, slow.body
        rid = slow.json["reqId"]
        assert rid == slow.headers["NVCF-REQID"] and slow.json["status"] == "in-progress"
        assert slow.json["waitReason"] == slow.headers["NVCF-WAIT-REASON"] and slow.json["waitReason"] in (
            "queued", "running"
        )  # fmt: skip
        assert "response" not in slow.json and "errorCode" not in slow.json
        final = await until_done(p.key, f"/v2/nvcf/exec/status/{rid}")
        assert final.status == 200, final.body
        assert final.json == {"reqId": rid, "status": "fulfilled", "percentComplete": 100, "response": {"done": True}}
        gone = await p.key.get(f"/v2/nvcf/exec/status/{rid}")
        assert gone.status == 404 and gone.headers["Content-Type"].startswith(PROBLEM)
        assert (await p.key.get(f"/v2/nvcf/exec/status/{uuid.uuid4()}")).status == 404


@pytest.mark.slow
async def test_host_routing_passes_method_path_query_and_body_through(tmp_path: Path) -> None:
    async with platform(tmp_path) as p, launching_agent(p, tmp_path / "instances"):
        fid, vid = await deployed(p.admin, MIRROR)
        api = unchecked(p.key)
        host = {"Host": f"{fid}.invocation.example.com"}

        got = await api.get("/echo-request/some/where?x=1&y=two%20words", headers=host)
        assert got.status == 200, got.body
        seen = got.json
        assert (seen["method"], seen["path"], seen["query"], seen["body"]) == (
            "GET", "/echo-request/some/where", "x=1&y=two%20words", ""
        )  # fmt: skip
        assert "Authorization" not in seen["headers"]
        # The worker's compatibility mode is off, as NVCF injects it for a passthrough: no JSON default
        # for a request without a Content-Type, whatever the caller said about the mode.
        sent = {k.lower(): v for k, v in seen["headers"].items()}
        assert sent["nvcf-feature-disable-worker-compatibility"] == "true" and "content-type" not in sent
        asked_on = await api.get(
            "/echo-request", headers={**host, "NVCF-Feature-Disable-Worker-Compatibility": "false"}
        )
        assert {k.lower(): v for k, v in asked_on.json["headers"].items()}[
            "nvcf-feature-disable-worker-compatibility"
        ] == "true"
        # The worker's NVCF-* headers, echoed back by the function: it is this function, any version.
        assert got.headers["NVCF-FUNCTION-ID"] == fid and got.headers["NVCF-FUNCTION-VERSION-ID"] == vid
        assert got.headers["NVCF-STATUS"] == "fulfilled" and got.headers["NVCF-REQID"]

        put = await api.put("/echo-request/items/7", data=b"payload", headers={**host, "Content-Type": "text/plain"})
        assert put.status == 200 and (put.json["method"], put.json["path"], put.json["body"]) == (
            "PUT", "/echo-request/items/7", "payload"
        )  # fmt: skip
        # The function's own status, even for a path it does not serve.
        unserved = await api.get("/", headers=host)
        assert unserved.status == 404 and unserved.headers["NVCF-STATUS"] == "errored"
        assert unserved.body == b"404: Not Found"
        preflight = await api.call("OPTIONS", "/echo-request/cors", headers=host)
        assert preflight.status == 200 and preflight.json["method"] == "OPTIONS"  # no CORS layer in between

        pinned = await api.delete("/echo-request/a?b=c", headers={"Host": f"{vid}.{fid}.invocation.example.com:8080"})
        assert pinned.status == 200 and pinned.headers["NVCF-FUNCTION-VERSION-ID"] == vid
        assert (pinned.json["method"], pinned.json["path"], pinned.json["query"]) == (
            "DELETE",
            "/echo-request/a",
            "b=c",
        )

        # By header: even a platform path goes to the function when the request names one.
        named = await api.post("/echo-request/v2", {"x": 1}, headers={"function-id": fid})
        assert named.status == 200 and named.json["path"] == "/echo-request/v2"
        assert json.loads(named.json["body"]) == {"x": 1}
        platform_path = await api.post("/v2/nvcf/functions", {"name": "x"}, headers={"function-id": fid})
        assert platform_path.status == 404 and platform_path.body == b"404: Not Found"  # the function's 404
        both = await api.get("/echo-request", headers={"function-id": fid, "function-version-id": vid})
        assert both.status == 200 and both.headers["NVCF-FUNCTION-VERSION-ID"] == vid

        # The poll window applies: 202, then the result by polling.
        slow = await api.post(
            "/echo-request/slow", {"answer": {"delay": 2.5, "body": "late"}}, headers={**host, "NVCF-POLL-SECONDS": "1"}
        )
        assert slow.status == 202 and slow.headers["NVCF-REQID"]
        status_url = f"/v2/nvcf/pexec/status/{slow.headers['NVCF-REQID']}"
        running = await p.key.call("HEAD", status_url)  # a look at it, not a fetch
        assert running.status == 202 and running.headers["NVCF-STATUS"] == "in-progress" and running.body == b""

        async def ready() -> Reply | None:
            head = await p.key.call("HEAD", status_url)
            return head if head.status != 202 else None

        done = await wait_for(ready, timeout=30, what="the result, by HEAD")
        assert done.status == 200 and done.headers["NVCF-STATUS"] == "fulfilled" and done.body == b""
        assert done.headers["Content-Length"] == "4" and done.headers["Content-Type"].startswith("text/plain")
        assert (await p.key.call("HEAD", status_url)).status == 200  # still there: a HEAD takes nothing
        stranger = p.api(await other_account_key(p, "stranger"))
        assert (await stranger.call("HEAD", status_url)).status == 404  # nor shows it to another account
        late = await p.key.get(status_url)
        assert late.status == 200 and late.body == b"late"
        assert (await p.key.call("HEAD", status_url)).status == 404  # fetched: gone

        # Auth as pexec, errors as problem+json.
        for reply, status in (
            (await unchecked(p.anonymous).get("/x", headers=host), 401),
            (await unchecked(p.task_key).get("/x", headers=host), 403),
            (await api.get("/x", headers={"Host": f"{uuid.uuid4()}.invocation.example.com"}), 404),
            (await api.get("/x", headers={"Host": f"{uuid.uuid4()}.{fid}.invocation.example.com"}), 404),
            (await api.get("/x", headers={"function-id": "not-a-uuid"}), 400),
            (await api.get("/x", headers={"function-id": fid, "function-version-id": "v1"}), 400),
        ):
            assert reply.status == status, (status, reply.body)
            assert reply.headers["Content-Type"].startswith(PROBLEM)

        # Without those headers the platform's own routes are untouched, whatever the Host.
        listed = await p.admin.get("/v2/nvcf/functions")
        assert listed.status == 200 and any(f["id"] == fid for f in listed.json["functions"])
        other = await p.admin.get("/v2/nvcf/functions", headers={"Host": f"{fid}.example.com"})
        assert other.status == 200 and "functions" in other.json
        nowhere = await unchecked(p.admin).get("/some/where", headers={"Host": "api.example.com"})
        assert nowhere.status == 404 and "no route" in nowhere.detail


async def upload_asset(p: Platform, content: bytes = b"input", *, upload: bool = True) -> str:
    """Create an asset in the key's account and (by default) upload its content."""
    created = await p.key.post("/v2/nvcf/assets", {"contentType": "text/plain", "description": "input"})
    assert created.status == 200, created.body
    if upload:
        put_url = created.json["uploadUrl"]
        async with p.key.session.put(put_url, data=content, headers={"Content-Type": "text/plain"}) as resp:
            assert resp.status == 200, await resp.text()
    return str(created.json["assetId"])


@pytest.mark.slow
async def test_input_asset_references_are_checked_and_travel_with_the_request(tmp_path: Path) -> None:
    # A scripted agent whose instances never serve: requests stay queued, where their asset ids can be read.
    async with platform(tmp_path) as p, agent(p.bus):
        fid, vid = await deployed(p.admin, ECHO_FUNCTION)
        url = f"/v2/nvcf/pexec/functions/{fid}"
        region = p.host.settings.node.region
        a1, a2, a3 = [await upload_asset(p) for _ in range(3)]

        async def queued_assets(reply: Reply) -> tuple[str, ...]:
            assert reply.status == 202, reply.body
            rid = reply.headers["NVCF-REQID"]
            stored = await p.bus.stream(subjects.request_stream(region, vid)).get_last(
                subjects.request_subject(region, vid, rid)
            )
            assert stored is not None
            return Request.decode(stored.data).asset_ids

        async def pexec(*values: str) -> Reply:
            headers = CIMultiDict([("NVCF-POLL-SECONDS", "1"), ("Authorization", f"Bearer {p.key.token}")])
            for value in values:
                headers.add("NVCF-INPUT-ASSET-REFERENCES", value)
            async with p.key.session.post(p.key.base + url, json={"message": "x"}, headers=headers) as resp:
                return Reply(status=resp.status, headers=dict(resp.headers), body=await resp.read())

        # Comma-separated, repeatable, trimmed, any case: the canonical ids, in order.
        assert await queued_assets(await pexec(f" {a1} ,{a2.upper()}", a3)) == (a1, a2, a3)
        assert await queued_assets(await pexec("", " , ")) == ()
        via_exec = await p.key.post(
            f"/v2/nvcf/exec/functions/{fid}",
            {
                "requestBody": {"message": "x"},
                "requestHeader": {"inputAssetReferences": [a3], "pollDurationSeconds": 1},
            },
        )
        assert await queued_assets(via_exec) == (a3,)

        bad = await pexec(f"{a1},12345")
        assert bad.status == 400 and "NVCF-INPUT-ASSET-REFERENCES" in json.loads(bad.body)["detail"]
        missing = str(uuid.uuid4())
        not_uploaded = await upload_asset(p, upload=False)
        for refs, absent in ((f"{a1},{missing}", missing), (not_uploaded, not_uploaded)):
            refused = await pexec(refs)
            assert refused.status == 404, refused.body
            assert json.loads(refused.body)["detail"] == f"NotFound error: failed to find asset {absent}"

        # A deleted asset is refused as soon as the invocation plane has seen the delete.
        assert (await p.key.delete(f"/v2/nvcf/assets/{a2}")).status == 204

        async def refused_now() -> bool:
            return (await pexec(a2)).status == 404

        await wait_for(refused_now, timeout=10, what="the deleted asset to be refused")


@pytest.mark.slow
async def test_idempotency_key_names_one_request(tmp_path: Path) -> None:
    async with platform(tmp_path) as p, launching_agent(p, tmp_path / "instances"):
        fid, _ = await deployed(p.admin, MIRROR)
        url = f"/v2/nvcf/pexec/functions/{fid}"

        async def call(key: str, body: Any, **headers: str) -> Reply:
            return await p.key.post(url, body, headers={"Idempotency-Key": key, **headers})

        async def calls_so_far() -> int:
            """The mirror counts the calls it got; this asks it (one more call)."""
            reply = await p.key.post(url, {})
            assert reply.status == 200
            return int(reply.json["count"])

        # Sequential retries: the same request and the same answer; the function ran once.
        before = await calls_so_far()
        first = await call("order-1", {"n": 1})
        assert first.status == 200 and first.json["headers"]["Idempotency-Key"] == "order-1"
        again = await call("order-1", {"n": 1})
        assert again.status == 200 and again.headers["NVCF-REQID"] == first.headers["NVCF-REQID"]
        assert again.json == first.json
        assert await calls_so_far() == before + 2  # the first call and this probe, not the retry
        other = await call("order-2", {"n": 1})
        assert other.status == 200 and other.headers["NVCF-REQID"] != first.headers["NVCF-REQID"]
        # The same key with another body is a different request: refused (422), never answered with the first's
        # result, and nothing runs. Bodies past the fingerprinted MiB compare too.
        before = await calls_so_far()
        clash = await call("order-1", {"n": 2})
        assert clash.status == 422 and first.headers["NVCF-REQID"] in clash.detail, clash.body
        big = await call("order-big", {"pad": "x" * 1_500_000})
        assert big.status == 200
        assert (await call("order-big", {"pad": "x" * 1_500_000})).headers["NVCF-REQID"] == big.headers["NVCF-REQID"]
        assert (await call("order-big", {"pad": "y" * 1_500_000})).status == 422
        assert await calls_so_far() == before + 2  # the big body once, and this probe
        # exec's requestBody is compared the same way.
        exec_url, exec_key = f"/v2/nvcf/exec/functions/{fid}", {"Idempotency-Key": "exec-1"}
        ran = await p.key.post(exec_url, {"requestBody": {"n": 1}}, headers=exec_key)
        assert ran.status == 200, ran.body
        again = await p.key.post(exec_url, {"requestBody": {"n": 1}}, headers=exec_key)
        assert again.status == 200 and again.json["reqId"] == ran.json["reqId"]
        assert (await p.key.post(exec_url, {"requestBody": {"n": 2}}, headers=exec_key)).status == 422

        # Two concurrent retries: one request, both get its answer.
        before = await calls_so_far()
        replies: list[Reply] = []

        async def one() -> None:
            replies.append(await call("order-3", {"answer": {"delay": 1.5, "body": "once"}}))

        async with anyio.create_task_group() as tg:
            tg.start_soon(one)
            tg.start_soon(one)
        assert [r.status for r in replies] == [200, 200], [r.body for r in replies]
        assert replies[0].headers["NVCF-REQID"] == replies[1].headers["NVCF-REQID"]
        assert replies[0].body == replies[1].body == b"once"
        assert await calls_so_far() == before + 2

        # A retry while the request still runs: 202 with the same NVCF-REQID, nothing enqueued again.
        before = await calls_so_far()
        pending = await call("order-4", {"answer": {"delay": 2.5, "body": "late"}}, **{"NVCF-POLL-SECONDS": "1"})
        assert pending.status == 202
        rid = pending.headers["NVCF-REQID"]
        retry = await call("order-4", {"answer": {"delay": 2.5, "body": "late"}}, **{"NVCF-POLL-SECONDS": "1"})
        assert retry.status == 202 and retry.headers["NVCF-REQID"] == rid and retry.headers["NVCF-WAIT-REASON"]
        late = await wait_for(
            lambda: _finished(
                call("order-4", {"answer": {"delay": 2.5, "body": "late"}}, **{"NVCF-POLL-SECONDS": "1"})
            ),
            timeout=30,
            what="the result",
        )
        assert late.status == 200 and late.body == b"late" and late.headers["NVCF-REQID"] == rid
        assert await calls_so_far() == before + 2
        # Its status poll takes the result; a retry after that has nothing to return.
        polled = await p.key.get(f"/v2/nvcf/pexec/status/{rid}")
        assert polled.status == 200 and polled.body == b"late"
        spent = await call("order-4", {"answer": {"delay": 2.5, "body": "late"}})
        assert spent.status == 409 and spent.headers["NVCF-REQID"] == rid and "Idempotency-Key" in spent.detail

        # Bad input claims nothing; a request cancelled by its client frees its key for the retry.
        refused = await call("order-5", {}, **{"NVCF-POLL-SECONDS": "0x10"})
        assert refused.status == 400
        assert (await call("order-5", {})).status == 200
        assert (await call("k" * 300, {})).status == 400
        with anyio.move_on_after(1):
            await call("order-6", {"answer": {"delay": 5, "body": "abandoned"}})
        rerun = await wait_for(  # another body: 422 until the abandoned request has let go of the key
            lambda: _finished(call("order-6", {}, **{"NVCF-POLL-SECONDS": "1"}), also=422),
            timeout=30,
            what="a fresh run",
        )
        assert rerun.status == 200 and rerun.json["path"] == "/echo-request"  # run again, not the abandoned one


async def test_a_retry_that_found_a_key_just_before_its_release_claims_it_again(tmp_path: Path) -> None:
    """The race behind a retry racing a client that hung up: the retry finds the key, then the first
    request releases it (key and record gone) before the retry reads the record. The retry must not
    answer 409 "already fetched" for a request that never ran; it claims the key again."""
    async with platform(tmp_path) as p, launching_agent(p, tmp_path / "instances"):
        fid, vid = await deployed(p.admin, MIRROR)
        plane = p.host.plugin("invocation")
        assert isinstance(plane, InvocationPlane)
        invoker = plane.invoker.get()
        assert invoker.idempotency is not None
        fv = invoker.routing.version(fid, vid)
        assert fv is not None
        first = await invoker.idempotency.claim("acct-x", fv, "order-race", "")
        retry = await invoker.idempotency.claim("acct-x", fv, "order-race", "")
        assert first.owner and not retry.owner and retry.request_id == first.request_id
        request = make_mocked_request("POST", f"/v2/nvcf/pexec/functions/{fid}")
        await invoker.idempotency.release(first)
        assert await invoker.waiting.replay(request, retry, poll=1, buffered=True) is None
        again = await invoker.idempotency.claim("acct-x", fv, "order-race", "")
        assert again.owner and again.request_id != first.request_id


async def _finished(pending: Any, *, also: int = 202) -> Reply | None:
    """The reply, or None for a 202 (or the ``also`` status) to try again."""
    reply: Reply = await pending
    return None if reply.status in (202, also) else reply


@pytest.mark.slow
async def test_invocation_metrics_have_nvcf_names(tmp_path: Path) -> None:
    async with platform(tmp_path) as p, launching_agent(p, tmp_path / "instances"):
        fid, vid = await deployed(p.admin, ECHO_FUNCTION)
        url = f"/v2/nvcf/pexec/functions/{fid}"
        assert (await p.key.post(url, {"message": "m"})).status == 200
        assert (await p.key.post(f"/v2/nvcf/pexec/functions/{uuid.uuid4()}", {"message": "m"})).status == 404
        assert (await p.key.post(url, {"message": "m"}, headers={"NVCF-POLL-SECONDS": "x"})).status == 400
        with anyio.move_on_after(1):  # a client that hangs up before the answer
            await p.key.post(url, {"message": "m", "delay": 5})

        async def scrape() -> str:
            reply = await p.anonymous.get("/metrics")
            assert reply.status == 200
            return reply.body.decode()

        labels = f'function_id="{fid}",function_version_id="{vid}"'

        async def settled() -> str | None:
            text = await scrape()
            return text if f'app_invocation_error{{http_status_code="499",function_id="{fid}"}} 1' in text else None

        text = await wait_for(settled, timeout=15, what="the 499 to be counted")
        assert re.search(rf'^function_request\{{{labels},nca_id="[^"]+"\}} 3$', text, re.M), text
        assert f"function_request_latency_count{{{labels}}} 3" in text
        assert f'function_request_latency_bucket{{{labels},le="1800"}} 3' in text
        assert 'app_invocation_error{http_status_code="404",function_id="unknown"} 1' in text
        assert f'app_invocation_error{{http_status_code="400",function_id="{fid}"}} 1' in text

        async def depth() -> bool:
            return f"nvcf_worker_nats_queue_depth_and_inflight{{{labels}}}" in await scrape()

        await wait_for(depth, timeout=15, what="the queue-depth gauge")

        # A deleted function leaves no series behind: /metrics grows with what exists, not with history.
        assert (await p.admin.delete(f"/v2/nvcf/functions/{fid}/versions/{vid}")).status == 204

        async def forgotten() -> str | None:
            text = await scrape()
            return None if fid in text else text

        text = await wait_for(forgotten, timeout=15, what="the deleted function's series to go")
        assert 'app_invocation_error{http_status_code="404",function_id="unknown"} 1' in text


def _timings(header: str) -> dict[str, float]:
    """``Server-Timing`` as name -> milliseconds."""
    found = {}
    for entry in header.split(","):
        name, *params = (part.strip() for part in entry.split(";"))
        durations = [float(p[4:]) for p in params if p.startswith("dur=")]
        assert len(durations) == 1, header
        found[name] = durations[0]
    return found


@pytest.mark.slow
async def test_server_timing_tells_the_wait_in_the_queue_from_the_functions_time(tmp_path: Path) -> None:
    """One slot, two calls of 0.6 s at once: the second waits about 0.6 s in the queue, then runs 0.6 s."""
    async with platform(tmp_path) as p, launching_agent(p, tmp_path / "instances"):
        fid, vid = await deployed(p.admin, ECHO_FUNCTION, concurrency=1)
        url = f"/v2/nvcf/pexec/functions/{fid}"
        assert (await p.key.post(url, {"message": "warm"})).status == 200
        replies: list[Reply] = []

        async def call() -> None:
            replies.append(await p.key.post(url, {"message": "m", "delay": 0.6}))

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            await anyio.sleep(0.1)
            tg.start_soon(call)
        first, second = (_timings(r.headers["Server-Timing"]) for r in replies)
        for timing in (first, second):
            assert 600 <= timing["execution"] < 1500, timing
            assert timing["enqueue"] <= timing["intake"], timing
        assert first["queue"] < 300, first
        assert 300 <= second["queue"] < 1200, second  # the first one's 0.6 s, less the 0.1 s between them

        reply = await p.anonymous.get("/metrics")
        labels = f'function_id="{fid}",function_version_id="{vid}"'
        text = reply.body.decode()
        assert f"nvcf_invocation_execution_seconds_count{{{labels}}} 3" in text, text
        assert f"nvcf_invocation_queue_wait_seconds_count{{{labels}}} 3" in text, text
        assert f'nvcf_invocation_queue_wait_seconds_bucket{{{labels},le="0.25"}} 2' in text, text


@pytest.mark.slow
async def test_the_access_log_names_each_invocation_and_leaves_the_query_out(tmp_path: Path) -> None:
    buffer = io.StringIO()
    root = logging.getLogger()
    level = root.level
    configure_logging(LoggingSettings(format="json"), stream=buffer)
    try:
        async with platform(tmp_path, **{"logging.access_log": 1.0}) as p, launching_agent(p, tmp_path / "instances"):
            fid, _ = await deployed(p.admin, ECHO_FUNCTION)
            ok = await p.key.post(f"/v2/nvcf/pexec/functions/{fid}?token=secret", {"message": "m"})
            assert ok.status == 200
            missing = await p.key.post(f"/v2/nvcf/pexec/functions/{uuid.uuid4()}", {"message": "m"})
            assert missing.status == 404
    finally:
        for handler in [h for h in root.handlers if getattr(h, "_nvcf_mono", False)]:
            root.removeHandler(handler)
        root.setLevel(level)
    access = [json.loads(line) for line in buffer.getvalue().splitlines() if '"nvcf_mono.access"' in line]
    invocations = [a for a in access if a["path"].startswith("/v2/nvcf/pexec/")]
    assert [a["status"] for a in invocations] == [200, 404], invocations
    assert invocations[0]["request_id"] == ok.headers["NVCF-REQID"]
    assert invocations[0]["route"] == "/v2/nvcf/pexec/functions/{functionId}"
    assert invocations[0]["method"] == "POST" and invocations[0]["duration_ms"] > 0
    assert not any("secret" in json.dumps(a) for a in access)


def test_server_timing_without_the_workers_timing_is_one_wait() -> None:
    timing = Timing(started=10.0, dispatching=10.001, queued=10.002)
    assert _timings(timing.header(10.5, None)) == {"intake": 2.0, "enqueue": 1.0, "wait": 498.0}
    # The worker took 100 ms of the head's 498 ms since stored, 80 of them in the function.
    assert _timings(timing.header(10.5, (100.0, 80.0))) == {
        "intake": 2.0,
        "enqueue": 1.0,
        "queue": 398.0,
        "prepare": 20.0,
        "execution": 80.0,
    }


def test_which_requests_host_routing_takes() -> None:
    fid, vid = str(uuid.uuid4()), str(uuid.uuid4())

    def named(headers: dict[str, str]) -> tuple[str, str | None] | None:
        return target(make_mocked_request("GET", "/p?q=1", headers=headers))

    assert named({"Host": f"{fid}.invocation.example.com"}) == (fid, None)
    assert named({"Host": f"{vid}.{fid}.invocation.example.com:8080"}) == (fid, vid)
    assert named({"Host": f"{fid.upper()}.invocation.example.com"}) == (fid, None)
    assert named({"function-id": fid, "Host": "127.0.0.1:8080"}) == (fid, None)
    assert named({"function-id": fid, "function-version-id": vid}) == (fid, vid)
    for host in (f"{fid}.example.com", "invocation.example.com", "127.0.0.1:8080", f"x{fid}.invocation.example.com"):
        assert named({"Host": host}) is None, host
    with pytest.raises(ProblemError) as bad:
        named({"function-id": "fn-1"})
    assert bad.value.status == 400


def test_asset_references_are_parsed_as_nvcf_does() -> None:
    a, b = str(uuid.uuid4()), str(uuid.uuid4())
    assert parse_references([f" {a} , {b.upper()} ", "", a]) == (a, b)
    assert parse_references([]) == ()
    with pytest.raises(ProblemError) as bad:
        parse_references([f"{a},nope"])
    assert bad.value.status == 400 and "NVCF-INPUT-ASSET-REFERENCES" in bad.value.detail


@pytest.mark.slow
async def test_a_compressed_body_reaches_the_function_decoded_and_a_broken_one_is_refused(tmp_path: Path) -> None:
    async with platform(tmp_path) as p, launching_agent(p, tmp_path / "instances"):
        fid, _ = await deployed(p.admin, MIRROR)
        url = f"/v2/nvcf/pexec/functions/{fid}"
        doc = b'{"hello": "compressed"}'
        json_type = {"Content-Type": "application/json"}
        for coding, packed in (
            ("gzip", gzip.compress(doc)),
            ("deflate", zlib.compress(doc)),
            ("GZIP", gzip.compress(doc)),
        ):
            # The server decoded it as it read it: the function gets the body, without the coding.
            seen = await p.key.post(url, data=packed, headers={**json_type, "Content-Encoding": coding})
            assert seen.status == 200, seen.body
            assert seen.json["body"] == doc.decode()
            assert "content-encoding" not in {k.lower() for k in seen.json["headers"]}, seen.json["headers"]
        # A coding the server does not decode is the function's to read, as it came.
        raw = await p.key.post(url, data=b"LZW bytes", headers={**json_type, "Content-Encoding": "compress"})
        assert raw.status == 200 and raw.json["body"] == "LZW bytes"
        assert {k.lower(): v for k, v in raw.json["headers"].items()}["content-encoding"] == "compress"

        broken = await p.key.post(url, data=b"not gzip at all", headers={**json_type, "Content-Encoding": "gzip"})
        assert broken.status == 400 and broken.detail == "the request body is not valid data of its Content-Encoding"
        unsupported = await p.key.post(url, data=doc, headers={**json_type, "Content-Encoding": "br"})
        assert unsupported.status == 415 and "Content-Encoding is not supported" in unsupported.detail
        wrapped = await p.key.post(
            f"/v2/nvcf/exec/functions/{fid}",
            data=gzip.compress(b'{"requestBody": {"n": 1}}'),
            headers={**json_type, "Content-Encoding": "gzip"},
        )
        assert wrapped.status == 200 and json.loads(wrapped.json["response"]["body"]) == {"n": 1}
        assert (await p.key.post(url, {"after": "all that"})).status == 200  # the node serves on
