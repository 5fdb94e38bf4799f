"""Browsers may call the invocation routes from any origin, as NVCF's invocation service allows.

Real processes: the platform on its own NATS, and an instance (the test echo server and
``nvcf-mono worker``) started by a scripted agent.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from nvcf_mono.testing.platform import Api
from nvcf_mono.testing.running import ECHO_FUNCTION, deployed, launching_agent, platform

pytestmark = pytest.mark.slow

MIRROR = {**ECHO_FUNCTION, "name": "mirror", "inferenceUrl": "/echo-request"}
PAGE = "https://app.example.org"


def unchecked(api: Api) -> Api:
    """Preflights are not operations of the OpenAPI document: no response check for them."""
    return Api(api.session, api.base, api.token, timeout=api.timeout)


async def test_pages_on_any_origin_may_invoke_and_read_the_request_id(tmp_path: Path) -> None:
    async with platform(tmp_path) as p, launching_agent(p, tmp_path / "instances"):
        fid, vid = await deployed(p.admin, MIRROR)
        anonymous = unchecked(p.anonymous)

        # The preflight needs no credential (a browser sends none) and echoes what it asked for.
        for path, allow in (
            (f"/v2/nvcf/pexec/functions/{fid}", "POST"),
            (f"/v2/nvcf/pexec/functions/{fid}/versions/{vid}", "POST"),
            (f"/v2/nvcf/exec/functions/{fid}", "POST"),
            ("/v2/nvcf/pexec/status/00000000-0000-0000-0000-000000000000", "GET,HEAD"),
            ("/v2/nvcf/exec/status/00000000-0000-0000-0000-000000000000", "GET"),
            ("/v2/nvcf/pexec/large-responses/00000000-0000-0000-0000-000000000000", "GET,HEAD"),
        ):
            asked = {
                "Origin": PAGE,
                "Access-Control-Request-Method": allow.split(",")[0],
                "Access-Control-Request-Headers": "authorization,content-type,nvcf-poll-seconds",
            }
            pre = await anonymous.call("OPTIONS", path, headers=asked)
            assert pre.status == 200, (path, pre.status, pre.body)
            h = pre.headers
            assert h["Access-Control-Allow-Origin"] == PAGE and h["Access-Control-Allow-Credentials"] == "true"
            assert h["Access-Control-Allow-Methods"] == allow.split(",")[0]
            assert h["Access-Control-Allow-Headers"] == "authorization,content-type,nvcf-poll-seconds"
            assert h["Access-Control-Max-Age"] == "86400" and h["Allow"] == allow
            assert "Origin" in h["Vary"]

        # The call itself: the page may read the answer and its request id.
        called = await p.key.post(f"/v2/nvcf/pexec/functions/{fid}", {"x": 1}, headers={"Origin": PAGE})
        assert called.status == 200 and called.headers["Access-Control-Allow-Origin"] == PAGE
        assert called.headers["Access-Control-Allow-Credentials"] == "true"
        assert called.headers["Access-Control-Expose-Headers"] == "nvcf-reqid" and called.headers["NVCF-REQID"]
        # What the function exposes itself is kept, the request id added.
        own = await p.key.post(
            f"/v2/nvcf/pexec/functions/{fid}",
            {"answer": {"body": "hi", "headers": {"Access-Control-Expose-Headers": "X-Own"}}},
            headers={"Origin": PAGE},
        )
        assert own.status == 200 and own.headers["Access-Control-Expose-Headers"] == "X-Own, nvcf-reqid"
        # Refusals too, so the page can tell why.
        refused = await p.anonymous.post(f"/v2/nvcf/pexec/functions/{fid}", {"x": 1}, headers={"Origin": PAGE})
        assert refused.status == 401 and refused.headers["Access-Control-Allow-Origin"] == PAGE
        # Without an Origin (not a browser) no origin is named, and the request id is still exposed.
        plain = await p.key.post(f"/v2/nvcf/pexec/functions/{fid}", {"x": 1})
        assert "Access-Control-Allow-Origin" not in plain.headers
        assert plain.headers["Access-Control-Expose-Headers"] == "nvcf-reqid"

        # A streamed answer (its head goes out before its body): the same headers.
        echo, _ = await deployed(p.admin, ECHO_FUNCTION)
        async with p.key.session.post(
            f"{p.key.base}/v2/nvcf/pexec/functions/{echo}",
            json={"stream": True, "repeats": 3, "message": "m"},
            headers={"Authorization": f"Bearer {p.key.token}", "Accept": "text/event-stream", "Origin": PAGE},
        ) as streamed:
            assert streamed.status == 200 and streamed.headers["Content-Type"].startswith("text/event-stream")
            assert streamed.headers["Access-Control-Allow-Origin"] == PAGE
            assert streamed.headers["Access-Control-Expose-Headers"] == "nvcf-reqid"
            assert (await streamed.read()).count(b"data:") == 3

        # Only the invocation routes: the control plane's API is not opened to pages.
        api = await unchecked(p.admin).call("OPTIONS", "/v2/nvcf/functions", headers={"Origin": PAGE})
        assert api.status == 405 and "Access-Control-Allow-Origin" not in api.headers
        listed = await p.admin.get("/v2/nvcf/functions", headers={"Origin": PAGE})
        assert listed.status == 200 and "Access-Control-Allow-Origin" not in listed.headers
        # A host-routed OPTIONS is the function's (no CORS layer in between), as in NVCF.
        routed = await unchecked(p.key).call("OPTIONS", "/echo-request/x", headers={"function-id": fid, "Origin": PAGE})
        assert routed.status == 200 and routed.json["method"] == "OPTIONS"
        assert "Access-Control-Allow-Origin" not in routed.headers


async def test_pages_may_call_the_llm_gateway_and_read_its_ids(tmp_path: Path) -> None:
    """A chat page in a browser calls the gateway with its user's key, as it may call OpenAI's API."""
    async with platform(tmp_path) as p:
        anonymous = unchecked(p.anonymous)
        for path, allow in (("/v1/chat/completions", "POST"), ("/v1/embeddings", "POST"), ("/v1/models", "GET")):
            asked = {
                "Origin": PAGE,
                "Access-Control-Request-Method": allow,
                "Access-Control-Request-Headers": "authorization",
            }
            pre = await anonymous.call("OPTIONS", path, headers=asked)
            assert pre.status == 200, (path, pre.status, pre.body)
            assert pre.headers["Access-Control-Allow-Origin"] == PAGE and pre.headers["Allow"] == allow
            assert pre.headers["Access-Control-Allow-Headers"] == "authorization"
        key = unchecked(p.key)  # the gateway's routes are OpenAI's API, not in /v3/openapi
        listed = await key.call("GET", "/v1/models", headers={"Origin": PAGE})
        assert listed.status == 200 and listed.headers["Access-Control-Allow-Origin"] == PAGE
        assert listed.headers["Access-Control-Expose-Headers"] == "x-request-id"
        # An OpenAI error reaches the page with its origin named, so it can say why.
        missing = await key.call(
            "POST", "/v1/chat/completions", {"model": "nope", "messages": []}, headers={"Origin": PAGE}
        )
        assert missing.status == 404 and missing.headers["Access-Control-Allow-Origin"] == PAGE
        # The platform's own /v1 API (keys, tasks) stays closed to pages.
        keys = await anonymous.call("OPTIONS", "/v1/keys", headers={"Origin": PAGE})
        assert "Access-Control-Allow-Origin" not in keys.headers
