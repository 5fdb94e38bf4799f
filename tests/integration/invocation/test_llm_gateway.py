"""The OpenAI-compatible gateway, called with OpenAI's own Python client (unchanged, pointed at /v1).

The function is the example model server (image ``llm``, ``nvcf_mono.examples.llm``) run by the real
compute plane on the local backend, reached through the durable invocation path.
"""

from __future__ import annotations

import gzip
import json
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import openai
import pytest

from nvcf_mono.examples.llm import embedding, generate
from nvcf_mono.planes.invocation.llm.gateway import header_safe
from nvcf_mono.testing.platform import Api, wait_for, wait_status
from nvcf_mono.testing.running import LLM_FUNCTION
from tests.integration.compute.conftest import compute_platform, spec
from tests.integration.control.test_sharing import account_key, add_account

pytestmark = pytest.mark.slow

# 50 tokens a second: short answers stay quick, and a stream's pieces arrive visibly apart.
FAST_LLM = {
    "images.llm.command": json.dumps(
        ["{python}", "-m", "nvcf_mono.examples.llm", "--port", "{port}", "--tokens-per-second", "50"]
    )
}


async def deploy_llm(api: Api, *, min_instances: int = 1, **changes: Any) -> str:
    created = await api.post("/v2/nvcf/functions", {**LLM_FUNCTION, **changes})
    assert created.status == 200, created.body
    fid, vid = created.json["function"]["id"], created.json["function"]["versionId"]
    d = f"/v2/nvcf/deployments/functions/{fid}/versions/{vid}"
    made = await api.post(d, {"deploymentSpecifications": [spec(min_instances=min_instances, max_instances=1)]})
    assert made.status == 200, made.body
    await wait_status(api, d, "ACTIVE", timeout=60)
    return str(fid)


def client(api: Api, token: str | None = None) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{api.base}/v1", api_key=token or api.token or "", max_retries=0, timeout=60)


async def test_chat_completions_embeddings_responses_and_models_through_the_gateway(tmp_path: Path) -> None:
    async with compute_platform(tmp_path, **FAST_LLM) as p:
        fid = await deploy_llm(p.admin)
        async with client(p.key) as llm:
            await chat_completions_embeddings_and_responses(llm, fid)

        # A delegation token is an OpenAI api_key too: it sees and calls the model it names, no other.
        other = await p.admin.post("/v2/nvcf/functions", {**LLM_FUNCTION, "name": "other-llm", "tags": ["model=other"]})
        assert other.status == 200, other.body
        async with client(p.key) as llm:
            assert sorted([m.id async for m in llm.models.list()]) == ["other", "tiny-llm"]
        minted = await p.key.post(f"/v2/nvcf/tokens/functions/{fid}", {"clientId": "partner"})
        assert minted.status == 200, minted.body
        async with client(p.key, minted.json["access_token"]) as partner:
            assert [m.id async for m in partner.models.list()] == ["tiny-llm"]
            messages: Any = [{"role": "user", "content": "hi"}]
            chat = await partner.chat.completions.create(model="tiny-llm", messages=messages, max_tokens=2)
            assert chat.choices[0].message.content
            with pytest.raises(openai.NotFoundError) as missing:
                await partner.chat.completions.create(model="other", messages=messages, max_tokens=2)
            assert "deployed" not in str(missing.value)  # unknown to it, not merely undeployed


async def chat_completions_embeddings_and_responses(llm: openai.AsyncOpenAI, fid: str) -> None:
    """Each OpenAI operation the gateway forwards, as the client library calls it."""
    assert [m.id async for m in llm.models.list()] == ["tiny-llm"]
    assert (await llm.models.retrieve("tiny-llm")).owned_by == "nvcf-default"
    # A model named as calls may name it, <functionId>/<model>, is one too.
    assert (await llm.models.retrieve(f"{fid}/tiny-llm")).id == f"{fid}/tiny-llm"
    listed = await llm.models.with_raw_response.list(extra_headers={"X-Request-ID": "list-1"})
    assert listed.headers["X-Request-ID"] == "list-1"

    messages: Any = [{"role": "user", "content": "tell me a story"}]
    chat = await llm.chat.completions.create(model="tiny-llm", messages=messages, max_tokens=5)
    expected = "".join(w if i == 0 else " " + w for i, w in enumerate(generate("tell me a story", 5)))
    assert chat.choices[0].message.content == expected
    assert chat.usage is not None and chat.usage.completion_tokens == 5
    # <functionId>/<model>: the function gets the model name after the slash (it 404s any other).
    again = await llm.chat.completions.create(model=f"{fid}/tiny-llm", messages=messages, max_tokens=5)
    assert again.choices[0].message.content == expected
    by_header = await llm.chat.completions.with_raw_response.create(
        model="tiny-llm",
        messages=messages,
        max_tokens=2,
        extra_headers={"X-NVCF-Function-ID": fid, "X-Request-ID": "trace-1"},
    )
    assert by_header.headers["X-Request-ID"] == "trace-1" and by_header.headers["NVCF-REQID"]

    completion = await llm.completions.create(model="tiny-llm", prompt="once upon", max_tokens=3)
    assert len(completion.choices[0].text.split()) == 3

    vectors = await llm.embeddings.create(model="tiny-llm", input=["alpha", "beta"])
    for item, text in zip(vectors.data, ("alpha", "beta"), strict=True):
        assert item.embedding == pytest.approx(embedding(text, 16), abs=1e-6)
    # An answer over the worker's 5 MiB direct limit still comes back itself (never a 302 to a zip).
    texts = [f"text {i}" for i in range(300)]
    many = await llm.embeddings.create(model="tiny-llm", input=texts, dimensions=1024, encoding_format="float")
    assert len(many.data) == 300 and many.data[299].embedding == pytest.approx(embedding("text 299", 1024), abs=1e-6)

    response = await llm.responses.create(model="tiny-llm", input="hello there", max_output_tokens=4)
    assert len(response.output_text.split()) == 4
    stream = await llm.responses.create(model="tiny-llm", input="hi", stream=True, max_output_tokens=3)
    events = [e.type async for e in stream]
    assert events[0] == "response.created" and events[-1] == "response.completed"
    assert events.count("response.output_text.delta") == 3
    # The SDK's stream helper builds the response from the item and part events: all must come, in order.
    async with llm.responses.stream(model="tiny-llm", input="hi", max_output_tokens=3) as helped:
        deltas = [e.delta async for e in helped if e.type == "response.output_text.delta"]
        final = await helped.get_final_response()
    assert final.output_text == "".join(deltas) and len(final.output_text.split()) == 3
    assert final.usage is not None and final.usage.output_tokens == 3


async def test_streamed_chat_arrives_as_the_function_writes_it_and_ends_with_done(tmp_path: Path) -> None:
    async with compute_platform(tmp_path, **FAST_LLM) as p:
        await deploy_llm(p.admin)
        async with client(p.key) as llm:
            stamps, usage = await streamed_chat(llm)
        assert len(stamps) == 40 and usage is not None and usage.completion_tokens == 40
        # 40 tokens at 50 a second: a buffered answer would arrive at once, not over ~0.8 s (the margin
        # lets a loaded machine stall the relay for a while without the stream looking buffered).
        assert stamps[-1] - stamps[0] > 0.3

        # The raw stream: OpenAI's framing, data: [DONE] last.
        body = {"model": "tiny-llm", "messages": [{"role": "user", "content": "x"}], "max_tokens": 3, "stream": True}
        headers = {"Authorization": f"Bearer {p.key.token}"}
        async with p.key.session.post(f"{p.key.base}/v1/chat/completions", json=body, headers=headers) as resp:
            assert resp.status == 200 and resp.content_type == "text/event-stream"
            events = [e for e in (await resp.text()).split("\n\n") if e.strip()]
        assert events[-1] == "data: [DONE]"
        assert all(e.startswith("data: {") for e in events[:-1])


async def streamed_chat(llm: openai.AsyncOpenAI) -> tuple[list[float], Any]:
    """When each content chunk arrived, and the usage of the stream's last chunk."""
    stamps: list[float] = []
    stream = await llm.chat.completions.create(
        model="tiny-llm",
        messages=[{"role": "user", "content": "stream please"}],
        max_tokens=40,
        stream=True,
        stream_options={"include_usage": True},
    )
    usage = None
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            stamps.append(time.monotonic())
        usage = chunk.usage or usage
    return stamps, usage


async def test_errors_are_openai_errors_and_other_accounts_models_are_invisible(tmp_path: Path) -> None:
    limited = {"plugins.invocation.llm_gateway.key_requests_per_minute": "3"}
    async with compute_platform(tmp_path, **FAST_LLM, **limited) as p:
        fid = await deploy_llm(p.admin)
        await add_account(p, "acct-b")
        other_key = await account_key(p, "acct-b")
        async with client(p.key) as llm, client(p.key, "not-a-key") as stranger, client(p.key, other_key) as other:
            await refusals(llm, stranger, other, fid)


async def refusals(llm: openai.AsyncOpenAI, stranger: openai.AsyncOpenAI, other: openai.AsyncOpenAI, fid: str) -> None:
    """Each refusal raises the exception OpenAI's client raises for it."""
    messages: Any = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.NotFoundError) as unknown:
        await llm.chat.completions.create(model="no-such-model", messages=messages)
    assert "no-such-model" in unknown.value.message
    with pytest.raises(openai.AuthenticationError):
        await stranger.chat.completions.create(model="tiny-llm", messages=messages)
    with pytest.raises(openai.BadRequestError):
        await llm.chat.completions.create(model="", messages=messages)
    # The function's own 400 passes through in its own (OpenAI) shape.
    with pytest.raises(openai.BadRequestError) as bad:
        await llm.chat.completions.create(model="tiny-llm", messages=[])
    assert "messages" in bad.value.message

    # Another account neither sees the model nor reaches it.
    assert [m.id async for m in other.models.list()] == []
    with pytest.raises(openai.NotFoundError):
        await other.chat.completions.create(model="tiny-llm", messages=messages)
    for by_id in ({"model": f"{fid}/tiny-llm"}, {"model": "x", "extra_headers": {"X-NVCF-Function-ID": fid}}):
        with pytest.raises(openai.NotFoundError):  # naming the function's id does not reach it either
            await other.chat.completions.create(messages=messages, **by_id)
    with pytest.raises(openai.NotFoundError):
        await other.models.retrieve(f"{fid}/tiny-llm")

    # The key's 3 requests a minute: refusals before a function was chosen cost nothing; the function's 400
    # above and two more calls are 3, and the 4th is refused until the bucket refills.
    await llm.chat.completions.create(model="tiny-llm", messages=messages, max_tokens=1)
    last = await llm.chat.completions.with_raw_response.create(model="tiny-llm", messages=messages, max_tokens=1)
    assert (last.headers["x-ratelimit-limit-requests"], last.headers["x-ratelimit-remaining-requests"]) == ("3", "0")
    with pytest.raises(openai.RateLimitError) as limited:
        await llm.chat.completions.create(model="tiny-llm", messages=messages, max_tokens=1)
    assert int(limited.value.response.headers["Retry-After"]) >= 1
    assert limited.value.response.headers["x-ratelimit-remaining-requests"] == "0"
    assert limited.value.code == "rate_limit_exceeded"


async def test_a_function_at_zero_instances_wakes_on_a_chat_request(tmp_path: Path) -> None:
    async with compute_platform(tmp_path, **FAST_LLM) as p:
        await deploy_llm(p.admin, min_instances=0)
        async with client(p.key) as llm:
            chat = await llm.chat.completions.create(
                model="tiny-llm", messages=[{"role": "user", "content": "wake up"}], max_tokens=2
            )
        assert chat.choices[0].message.content


async def test_a_call_past_the_wait_is_a_504_a_client_does_not_resend_and_its_result_is_kept(
    tmp_path: Path,
) -> None:
    """An answer that does not start within ``wait_seconds`` is OpenAI's 504 with ``NVCF-REQID``; the client
    (retrying twice, its default) sends the call once, since a resend would queue the inference again; the
    call goes on and its result is kept for ``/v2/nvcf/pexec/status``.
    """
    async with compute_platform(tmp_path, **FAST_LLM, **{"plugins.invocation.llm_gateway.wait_seconds": "1"}) as p:
        fid = await deploy_llm(p.admin)
        retrying = openai.AsyncOpenAI(base_url=f"{p.key.base}/v1", api_key=p.key.token or "", timeout=60)
        async with retrying as llm:
            with pytest.raises(openai.InternalServerError) as late:  # 100 words at 50 a second: 2 s
                await llm.chat.completions.create(
                    model="tiny-llm", messages=[{"role": "user", "content": "take your time"}], max_tokens=100
                )
        assert late.value.status_code == 504 and "/v2/nvcf/pexec/status/" in late.value.message
        reqid = late.value.response.headers["NVCF-REQID"]
        metrics = (await p.anonymous.get("/metrics")).body.decode()
        assert f'llm_api_gateway_http_requests_total{{function_id="{fid}",code="504"}} 1' in metrics, metrics

        async def kept() -> dict[str, Any] | None:
            status = await p.key.get(f"/v2/nvcf/pexec/status/{reqid}")
            return status.json if status.status == 200 else None

        done = await wait_for(kept, timeout=30, what="the call's result")
        assert done["object"] == "chat.completion" and done["usage"]["completion_tokens"] == 100


async def test_a_model_whose_deployment_failed_is_a_503_a_client_does_not_resend(tmp_path: Path) -> None:
    """A version in ERROR answers 503 with why, and nothing changes by waiting: OpenAI's client (retrying
    twice, its default) is told not to resend, so it raises at once; the 503s with ``Retry-After`` (a
    bus that did not take the call) stay retried.
    """
    broken = {"images.broken.command": json.dumps(["/nonexistent/bin/server", "--port", "{port}"])}
    async with compute_platform(tmp_path, **broken) as p:
        created = await p.admin.post("/v2/nvcf/functions", {**LLM_FUNCTION, "containerImage": "broken"})
        fid, vid = created.json["function"]["id"], created.json["function"]["versionId"]
        d = f"/v2/nvcf/deployments/functions/{fid}/versions/{vid}"
        made = await p.admin.post(d, {"deploymentSpecifications": [spec(min_instances=1, max_instances=1)]})
        assert made.status == 200, made.body
        await wait_status(p.admin, d, "ERROR", timeout=30)
        retrying = openai.AsyncOpenAI(base_url=f"{p.key.base}/v1", api_key=p.key.token or "", timeout=60)
        async with retrying as llm:
            with pytest.raises(openai.InternalServerError) as failed:
                await llm.chat.completions.create(model="tiny-llm", messages=[{"role": "user", "content": "hi"}])
        assert failed.value.status_code == 503 and "ERROR" in failed.value.message
        metrics = (await p.anonymous.get("/metrics")).body.decode()
        sent = re.findall(r'llm_api_gateway_http_requests_total\{function_id="[^"]*",code="503"\} (\d+)', metrics)
        assert sum(int(n) for n in sent) == 1, metrics  # counted by function, or "unknown" before one is chosen


async def test_bad_bodies_get_openai_errors_without_reaching_a_function(tmp_path: Path) -> None:
    async with compute_platform(tmp_path) as p:
        url, headers = f"{p.key.base}/v1/chat/completions", {"Authorization": f"Bearer {p.key.token}"}
        for data, fragment in (
            (b"{not json", "parse the JSON"),
            (b"[1, 2]", "JSON object"),
            (b'{"messages": []}', "model parameter"),
            (b'{"model": 5}', "expected a string, but got an integer"),
            (b'{"model": ["m"]}', "expected a string, but got an array"),
            (b'{"model": "m", "stream": "yes"}', "stream"),
            (b'{"model": "\\ud800/x"}', "parse the JSON"),  # a lone surrogate is not text
            (b'{"model": "00000000-0000-0000-0000-000000000000/x"}', "does not exist"),
        ):
            async with p.key.session.post(url, data=data, headers=headers) as resp:
                doc = json.loads(await resp.read())
                assert resp.status in (400, 404), (data, resp.status, doc)
                assert fragment in doc["error"]["message"], doc
                assert resp.headers["X-Request-ID"]

        # A body that arrives in pieces is read whole (a model nobody serves, so 404 rather than "not JSON").
        async def pieces() -> AsyncIterator[bytes]:
            for piece in (b'{"model": "some', b'-model", "messages": ', b"[]}"):
                yield piece
                await anyio.sleep(0.05)

        async with p.key.session.post(url, data=pieces(), headers=headers) as resp:
            assert resp.status == 404 and "some-model" in (await resp.json())["error"]["message"]
        zipped = {**headers, "Content-Encoding": "gzip"}
        async with p.key.session.post(url, data=gzip.compress(b'{"model": "zipped-model"}'), headers=zipped) as resp:
            assert resp.status == 404 and "zipped-model" in (await resp.json())["error"]["message"]  # read decoded
        async with p.key.session.post(url, data=b"not gzip", headers=zipped) as resp:
            doc = await resp.json()
            assert (
                resp.status == 400
                and doc["error"]["message"] == "the request body is not valid data of its Content-Encoding"
            )
            assert resp.headers["Connection"] == "close"
        bad_id = {**headers, "X-NVCF-Function-ID": "not an id"}
        async with p.key.session.post(url, json={"model": "m"}, headers=bad_id) as resp:
            assert resp.status == 400 and "not a valid id" in (await resp.json())["error"]["message"]
        async with aiohttp.ClientSession() as s, s.get(f"{p.key.base}/v1/models") as resp:
            assert resp.status == 401 and (await resp.json())["error"]["type"] == "authentication_error"

        # OpenAI's paths the gateway does not serve, or not with that method, answer in OpenAI's shape;
        # the platform's own /v1 paths and unknown ones elsewhere keep problem+json.
        for method, path, status in (
            ("GET", "/v1/chat/completions", 405),
            ("POST", "/v1/models", 405),
            ("POST", "/v1/audio/transcriptions", 404),
            ("POST", "/v1/moderations", 404),
        ):
            async with p.key.session.request(method, f"{p.key.base}{path}", headers=headers) as resp:
                doc = await resp.json()
                assert resp.status == status and doc["error"]["code"] is None, (path, doc)
                assert path in doc["error"]["message"] and resp.headers["X-Request-ID"]
                assert status == 404 or resp.headers["Allow"] in ("GET,HEAD", "POST")
        for path in ("/v1/chatty", "/v1/nvct/no-such-thing"):
            async with p.key.session.get(f"{p.key.base}{path}", headers=headers) as resp:
                assert resp.status == 404 and resp.content_type == "application/problem+json", path
        async with client(p.key) as oai:
            with pytest.raises(openai.NotFoundError, match="does not serve"):
                await oai.moderations.create(input="hello")


async def test_a_conversations_turns_stay_on_the_instance_that_took_its_first(tmp_path: Path) -> None:
    async with compute_platform(tmp_path, **FAST_LLM) as p:
        created = await p.admin.post("/v2/nvcf/functions", LLM_FUNCTION)
        fid, vid = created.json["function"]["id"], created.json["function"]["versionId"]
        d = f"/v2/nvcf/deployments/functions/{fid}/versions/{vid}"
        two = spec(min_instances=2, max_instances=2, maxRequestConcurrency=4)
        assert (await p.admin.post(d, {"deploymentSpecifications": [two]})).status == 200

        await wait_status(p.admin, d, "ACTIVE", timeout=60)
        async with client(p.key) as llm:

            async def turn(**extra: Any) -> str:
                chat = await llm.chat.completions.create(
                    model="tiny-llm", messages=[{"role": "user", "content": "hi"}], max_tokens=1, **extra
                )
                assert chat.system_fingerprint is not None
                return chat.system_fingerprint

            # Both instances serve: turns without a conversation go to either.
            deadline = time.monotonic() + 30
            seen: set[str] = set()
            while len(seen) < 2:
                assert time.monotonic() < deadline, f"only {seen} answered"
                seen.add(await turn())
            # A conversation (OpenAI's prompt_cache_key, or the header a client sends back) keeps its instance.
            for name in ("conv-a", "conv-b", "conv-c", "conv-d"):
                first = await turn(extra_body={"prompt_cache_key": name})
                rest = [await turn(extra_body={"prompt_cache_key": name}) for _ in range(6)]
                assert set(rest) == {first}, (name, first, rest)
            by_header = {await turn(extra_headers={"x-multi-turn-session-id": "conv-e"}) for _ in range(6)}
            assert len(by_header) == 1
            # A chat that names no conversation gets one back; sent back, it keeps its first turn's instance.
            messages: Any = [{"role": "user", "content": "hi"}]
            raw = await llm.chat.completions.with_raw_response.create(model="tiny-llm", messages=messages, max_tokens=1)
            given, first = raw.headers["x-multi-turn-session-id"], raw.parse().system_fingerprint
            assert {await turn(extra_headers={"x-multi-turn-session-id": given}) for _ in range(6)} == {first}
            named = await llm.chat.completions.with_raw_response.create(
                model="tiny-llm", messages=messages, max_tokens=1, extra_body={"prompt_cache_key": "conv-f"}
            )
            assert named.headers["x-multi-turn-session-id"] == "conv-f"
            # A key that cannot be a header value (OpenAI takes any string) travels as a digest of itself,
            # never written raw into the function's request or the answer's head, and still keeps its instance.
            for hostile in ("a\r\nX-Injected: 1", "пользователь-7", "x" * 300):
                sent = {"prompt_cache_key": hostile}
                answers = [
                    await llm.chat.completions.with_raw_response.create(
                        model="tiny-llm", messages=messages, max_tokens=1, extra_body=sent
                    )
                    for _ in range(4)
                ]
                assert {a.headers["x-multi-turn-session-id"] for a in answers} == {header_safe(hostile.strip())}
                assert header_safe(hostile.strip()).startswith("pck-") and "x-injected" not in answers[0].headers
                assert len({a.parse().system_fingerprint for a in answers}) == 1
            embedded = await llm.embeddings.with_raw_response.create(model="tiny-llm", input="x")
            assert "x-multi-turn-session-id" not in embedded.headers  # no conversation there
