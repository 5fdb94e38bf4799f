"""Error answers reach OpenAI clients in OpenAI's shape, whoever made them."""

from __future__ import annotations

import json
import tracemalloc

from aiohttp import web

from nvcf_mono.contracts.problems import PROBLEM_CONTENT_TYPE, problem_body, problem_type
from nvcf_mono.planes.invocation.llm.errors import QUOTED, in_openai_shape


def error_of(response: web.Response) -> dict[str, object]:
    assert isinstance(response.body, bytes) and response.content_type == "application/json"
    error: dict[str, object] = json.loads(response.body)["error"]
    return error


def test_the_platforms_problem_gives_its_detail_and_keeps_the_request_id() -> None:
    problem = web.Response(
        status=429,
        body=json.dumps({"type": problem_type(429), "status": 429, "detail": "queue full"}).encode(),
        content_type=PROBLEM_CONTENT_TYPE,
        headers={"NVCF-REQID": "r1", "Retry-After": "2", "X-Other": "x"},
    )
    shaped = in_openai_shape(problem)
    assert shaped.status == 429 and error_of(shaped)["message"] == "queue full"
    assert error_of(shaped)["code"] == "rate_limit_exceeded"
    assert shaped.headers["NVCF-REQID"] == "r1" and shaped.headers["Retry-After"] == "2"
    assert "X-Other" not in shaped.headers


def test_a_functions_error_in_another_shape_is_quoted() -> None:
    # A server that is not an OpenAI one answered its framework's 404: the client said only "Error code: 404".
    plain = in_openai_shape(web.Response(status=404, text="404: Not Found", headers={"NVCF-REQID": "r2"}))
    assert plain.status == 404 and error_of(plain)["message"] == "the model's server answered 404: 404: Not Found"
    assert error_of(plain)["code"] == "model_not_found" and plain.headers["NVCF-REQID"] == "r2"
    framework = in_openai_shape(web.json_response({"detail": "Method Not Allowed"}, status=405))
    assert error_of(framework)["message"] == "the model's server answered 405: Method Not Allowed"
    huge = in_openai_shape(web.Response(status=500, text="x" * 10_000))
    assert len(str(error_of(huge)["message"])) < QUOTED + 50
    assert error_of(in_openai_shape(web.Response(status=502)))["message"] == "the model's server answered 502"


def test_only_the_platforms_own_5xx_tell_clients_not_to_retry() -> None:
    # OpenAI's clients resend a 5xx twice unless told not to: the platform has done its own retrying,
    # the function's own error is the client's to retry as it would any server's.
    def problem(doc: dict[str, object]) -> web.Response:
        return web.Response(status=500, body=json.dumps(doc).encode(), content_type=PROBLEM_CONTENT_TYPE)

    worker = {"type": "urn:nvcf-worker-service:problem-details:internal-server-error", "detail": "gave up"}
    for platforms in (problem(problem_body(500, "the bus is away")), problem(worker)):
        shaped = in_openai_shape(platforms)
        assert shaped.headers["x-should-retry"] == "false" and error_of(shaped)["type"] == "server_error"
    functions = {"type": "https://example.com/probs/out-of-memory", "title": "OOM", "detail": "KV cache full"}
    shaped = in_openai_shape(problem(functions))
    assert error_of(shaped)["message"] == "the model's server answered 500: KV cache full"
    assert "x-should-retry" not in shaped.headers
    untyped = in_openai_shape(problem({"detail": "no type at all"}))
    assert "x-should-retry" not in untyped.headers and "answered 500: no type at all" in str(
        error_of(untyped)["message"]
    )


def test_answers_already_in_openai_shape_and_successes_pass_unchanged() -> None:
    own = web.json_response(
        {"error": {"message": "messages must not be empty", "type": "invalid_request_error"}}, status=400
    )
    assert in_openai_shape(own) is own
    ok = web.json_response({"id": "chatcmpl-1"})
    assert in_openai_shape(ok) is ok


def test_a_large_error_answer_is_read_one_level_deep() -> None:
    # The function's answer: its members are not turned into objects (a body of "{}"s took some 24 times
    # its size), and a detail too large to read is quoted from the body instead.
    many = b",".join([b"{}"] * ((3 << 20) // 3))
    body = b'{"detail": "bad prompt", "trace": [' + many + b"]}"
    tracemalloc.start()
    try:
        shaped = in_openai_shape(web.Response(status=400, body=body, content_type="application/json"))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert error_of(shaped)["message"] == "the model's server answered 400: bad prompt"
    assert peak < 2 * len(body), peak
