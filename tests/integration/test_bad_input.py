"""Each class of bad input the fuzzer found gets a 4xx problem+json, never a 500 (and nothing is stored).

The fuzz run of ``test_api_fuzz.py`` samples the whole API; these tests pin each class it found, so a
regression fails here by name: ids no item can have, bodies that are not JSON text, credentials that
are not ASCII, nulls inside lists, values the server must refuse rather than keep, and requests
aiohttp itself cannot parse.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from nvcf_mono.testing.platform import Api, Reply
from nvcf_mono.testing.running import CONTAINER_FUNCTION, agent, deployed, platform

FUNCTIONS = "/v2/nvcf/functions"
CLUSTERS = "/v1/accounts/nvcf-default/clusters"
SPEC = {"gpu": "H100", "instanceType": "ON-PREM.GPU.H100_1x", "minInstances": 0, "maxInstances": 1}


def problem(reply: Reply, status: int, *fragments: str) -> None:
    assert reply.status == status, (reply.status, reply.body[:500])
    assert reply.headers["Content-Type"].startswith("application/problem+json"), reply.headers
    detail = reply.json["detail"]
    for fragment in fragments:
        assert fragment.lower() in detail.lower(), (fragment, detail)


async def raw(port: int, payload: bytes) -> bytes:
    """Bytes on a fresh connection; everything the server answers before it closes."""
    async with await anyio.connect_tcp("127.0.0.1", port) as stream:
        await stream.send(payload)
        received = b""
        with anyio.fail_after(10):
            while True:
                try:
                    received += await stream.receive()
                except (anyio.EndOfStream, anyio.BrokenResourceError):
                    return received


async def function_count(api: Api) -> int:
    return len((await api.get(FUNCTIONS)).json["functions"])


@pytest.mark.slow
async def test_path_ids_no_item_can_have_are_a_400_on_every_kind_of_route(tmp_path: Path) -> None:
    async with platform(tmp_path) as p:
        bad_ids = ("b c", "é", ">", "*", "../..", "a..b", ".a", "x" * 300)
        for bad in bad_ids:
            quoted = bad.replace(" ", "%20").replace("/", "%2F").replace(">", "%3E").replace("é", "%C3%A9")
            for method, path in (
                ("GET", f"{FUNCTIONS}/a/versions/{quoted}"),
                ("GET", f"/v2/nvcf/pexec/status/{quoted}"),
                ("POST", f"/v2/nvcf/pexec/functions/{quoted}"),
                ("GET", f"/v2/nvcf/queues/{quoted}/position"),
                ("GET", f"/v2/nvcf/accounts/{quoted}/functions"),  # the account twin looks the account up
                ("GET", f"/v1/nvct/tasks/{quoted}"),
                ("GET", f"/v2/nvcf/assets/{quoted}/download"),  # a route without authentication
            ):
                reply = await p.admin.call(method, path, data=b"{}")
                problem(reply, 400, "not a valid id")
        # A valid id that names nothing is still a 404.
        problem(await p.admin.get(f"{FUNCTIONS}/a/versions/b"), 404)


async def test_bodies_that_are_not_json_text_are_a_400(tmp_path: Path) -> None:
    async with platform(tmp_path) as p:
        json_type = {"Content-Type": "application/json"}
        for data, headers, fragment in (
            (b'{"name": "\xff\xfe"}', json_type, "not valid utf-8"),
            (b"{}", {"Content-Type": "application/json; charset=no-such-charset"}, "unknown charset"),
            (b"[" * 5000 + b"]" * 5000, json_type, "nested deeper"),
            (b'{"a":' * 70 + b"1" + b"}" * 70, json_type, "nested deeper"),
            (b"{", json_type, "malformed json"),
        ):
            problem(await p.admin.post(FUNCTIONS, data=data, headers=headers), 400, fragment)
        deep_secret = {"name": "s", "value": {"a": {"b": {"c": "d"}}}}
        nested_ok = await p.admin.post(FUNCTIONS, {**CONTAINER_FUNCTION, "secrets": [deep_secret]})
        assert nested_ok.status == 200, nested_ok.body
        assert await function_count(p.admin) == 1


async def test_a_json_body_past_its_limit_is_a_413_before_it_is_read_whole(tmp_path: Path) -> None:
    # A JSON document takes many times its size as objects (a body of "{}"s about 24 times) and parsing
    # it holds the server: the management API's bodies stay small (http.max_json_body, 2 MiB by default),
    # whatever size invocation bodies may be.
    async with platform(tmp_path, **{"http.max_json_body": "64KiB"}) as p, agent(p.bus):
        many = b'{"name": "x", "tags": [' + b",".join([b"{}"] * 40_000) + b"]}"
        problem(await p.admin.post(FUNCTIONS, data=many, headers={"Content-Type": "application/json"}), 413)

        async def chunked() -> Any:  # no Content-Length: refused once what came passes the limit
            for _ in range(100):
                yield b" " * 4096
            yield b"{}"

        async with p.admin.session.post(
            p.admin.base + FUNCTIONS,
            data=chunked(),
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {p.admin.token}"},
        ) as resp:
            assert resp.status == 413 and "http.max_json_body" in (await resp.json())["detail"]
        fid, _ = await deployed(p.admin, CONTAINER_FUNCTION, min_instances=0)
        exec_body = {"requestHeader": {"pollDurationSeconds": 1}, "requestBody": {"pad": "x" * 70_000}}
        # exec answers 400 there, as NVCF's does past its 2 MB
        problem(await p.key.post(f"/v2/nvcf/exec/functions/{fid}", exec_body), 400, "http.max_json_body")
        pexec = await p.key.post(
            f"/v2/nvcf/pexec/functions/{fid}", {"pad": "x" * 70_000}, headers={"NVCF-POLL-SECONDS": "1"}
        )
        assert pexec.status == 202, pexec.body  # an invocation body is not a management API body
        assert await function_count(p.admin) == 1


async def test_an_authorization_header_that_is_not_ascii_is_a_401(tmp_path: Path) -> None:
    async with platform(tmp_path) as p:
        assert p.host.http is not None
        for header in (b"Bearer \xe9\xe8abc", b"Bearer nvapi-\xff"):
            answer = await raw(
                p.host.http.port,
                b"GET /v2/nvcf/functions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: "
                + header
                + b"\r\n\r\n",
            )
            assert answer.startswith(b"HTTP/1.1 401"), answer[:300]
            assert b"application/problem+json" in answer and b"ASCII" in answer, answer


async def test_nulls_and_wrong_types_inside_lists_are_a_400(tmp_path: Path) -> None:
    async with platform(tmp_path) as p:
        problem(await p.admin.post(FUNCTIONS, {**CONTAINER_FUNCTION, "tags": [None]}), 400, "tags.0")
        problem(await p.admin.post(FUNCTIONS, {**CONTAINER_FUNCTION, "tags": ["ok", 7]}), 400, "tags.1")
        problem(await p.admin.post(FUNCTIONS, {**CONTAINER_FUNCTION, "secrets": [None]}), 400, "secrets.0")
        problem(await p.admin.patch("/v2/nvcf/accounts/nvcf-default/clients/associate", {"clientIds": [1]}), 400)
        problem(await p.admin.patch("/v2/nvcf/accounts/nvcf-default/clients/associate", {"clientIds": [None]}), 400)
        cluster = {"clusterName": "edge", "clusterGroupName": "edge", "attributes": [None]}
        problem(await p.admin.post(CLUSTERS, cluster), 400, "attributes.0")
        assert await function_count(p.admin) == 0


async def test_values_the_server_must_refuse_rather_than_keep(tmp_path: Path) -> None:
    async with platform(tmp_path) as p:
        for change, fragment in (
            ({"inferenceUrl": "/a/../../etc"}, "'..'"),
            ({"inferenceUrl": "/a/%2e%2e/b"}, "'..'"),
            ({"inferenceUrl": "//evil.example.com/x"}, "path starting with '/'"),
            ({"healthUri": "/../health"}, "'..'"),
            ({"containerImage": "/etc/passwd"}, "image reference"),
            ({"containerImage": "../echo"}, "image reference"),
            ({"containerImage": "./bin/server"}, "image reference"),
            ({"health": {**CONTAINER_FUNCTION["health"], "timeout": "P999999999D"}}, "at most PT10M"),
            ({"health": {**CONTAINER_FUNCTION["health"], "uri": "/../x"}}, "'..'"),
        ):
            problem(await p.admin.post(FUNCTIONS, {**CONTAINER_FUNCTION, **change}), 400, fragment)
        assert await function_count(p.admin) == 0
        task = {"name": "t", "containerImage": "echo", "gpuSpecification": {"gpu": "H100", "instanceType": "x"}}
        for change, fragment in (
            ({"containerImage": "/usr/bin/python3"}, "image reference"),
            ({"maxRuntimeDuration": "P999999999D"}, "at most P30D"),
            ({"maxQueuedDuration": "P99999999999999999999D"}, "at most P30D"),
            ({"terminationGracePeriodDuration": "P2D"}, "at most P1D"),
        ):
            problem(await p.task_key.post("/v1/nvct/tasks", {**task, **change}), 400, fragment)


@pytest.mark.slow
async def test_poll_seconds_outside_0_to_3600_are_a_400(tmp_path: Path) -> None:
    async with platform(tmp_path) as p, agent(p.bus):
        fid, _ = await deployed(p.admin)  # ACTIVE on a scripted agent that starts nothing: nobody answers
        request_id = "6b1e4d3a-58a1-4a5e-9d58-2a1c0f000001"
        for value, said in (
            ("-1", "NVCF-POLL-SECONDS must be from 0 to 3600 seconds, got -1"),
            ("3601", "NVCF-POLL-SECONDS must be from 0 to 3600 seconds, got 3601"),
            ("soon", "NVCF-POLL-SECONDS must be a whole number of seconds, got 'soon'"),
        ):
            poll = {"NVCF-POLL-SECONDS": value}
            problem(await p.key.post(f"/v2/nvcf/pexec/functions/{fid}", {}, headers=poll), 400, said)
            problem(await p.key.get(f"/v2/nvcf/pexec/status/{request_id}", headers=poll), 400, said)
        exec_body = {"requestBody": {}, "requestHeader": {"pollDurationSeconds": -1}}
        problem(await p.key.post(f"/v2/nvcf/exec/functions/{fid}", exec_body), 400, "pollDurationSeconds")
        # 0 is clamped to 1, as NVCF does: a 202 after a second.
        zero = await p.key.post(f"/v2/nvcf/pexec/functions/{fid}", {}, headers={"NVCF-POLL-SECONDS": "0"})
        assert zero.status == 202, zero.body


async def test_put_of_a_deployment_checks_its_specs_as_a_deploy_does(tmp_path: Path) -> None:
    async with platform(tmp_path) as p, agent(p.bus):
        created = await p.admin.post(FUNCTIONS, CONTAINER_FUNCTION)
        fn = created.json["function"]
        d = f"/v2/nvcf/deployments/functions/{fn['id']}/versions/{fn['versionId']}"
        assert (await p.admin.post(d, {"deploymentSpecifications": [SPEC]})).status == 200
        for change, fragment in (
            ({"gpu": "Z999"}, "Invalid GPU"),
            ({"instanceType": "ON-PREM.GPU.H100_9x"}, "Invalid InstanceType"),
            ({"instanceType": "ON-PREM.GPU.H100_2x"}, "cannot change"),
        ):
            problem(await p.admin.put(d, {"deploymentSpecifications": [{**SPEC, **change}]}), 400, fragment)
        kept = (await p.admin.get(d)).json["deployment"]["deploymentSpecifications"][0]
        assert (kept["gpu"], kept["instanceType"], kept["maxInstances"]) == ("H100", SPEC["instanceType"], 1)
        rescaled = await p.admin.put(d, {"deploymentSpecifications": [{**SPEC, "maxInstances": 2}]})
        assert rescaled.status == 200, rescaled.body
        assert rescaled.json["deployment"]["deploymentSpecifications"][0]["maxInstances"] == 2


async def test_requests_aiohttp_cannot_parse_get_a_problem_without_their_bytes(tmp_path: Path) -> None:
    async with platform(tmp_path) as p:
        assert p.host.http is not None
        port = p.host.http.port
        secret = b"nvapi-SHOULD-NOT-ECHO"
        for payload, fragment in (
            (b"GET /v2/nvcf/functions HTTP/1.1\r\nHost: x\r\nX-Big: " + secret + b"a" * 9000 + b"\r\n\r\n", b"longer"),
            (b"GET /v2/nvcf/functions?" + secret + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", b"longer"),
            (
                b"GET / HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-H%d: 1\r\n" % i for i in range(200)) + b"\r\n",
                b"more headers",
            ),
            (b"GARBAGE " + secret + b"\r\n\r\n", b"method"),
            (b"GET / HTTP/1.1\r\nHost: x\r\nBad Header: " + secret + b"\r\n\r\n", b"not valid HTTP/1.1"),
        ):
            answer = await raw(port, payload)
            head, _, body = answer.partition(b"\r\n\r\n")
            assert b" 400 " in head.split(b"\r\n")[0], answer[:300]
            assert b"Content-Type: application/problem+json" in head, head
            assert fragment in body and secret not in answer, answer[:500]
        assert (await p.admin.get(FUNCTIONS)).status == 200  # and the server serves on
