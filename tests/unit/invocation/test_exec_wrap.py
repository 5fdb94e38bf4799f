"""exec wraps a function's JSON answer as the function wrote it, without turning it into objects."""

from __future__ import annotations

import json
import tracemalloc

import pytest
from aiohttp import web

from nvcf_mono.http.problem import ProblemError
from nvcf_mono.planes.invocation.exec_api import wrap


def answer(body: bytes, status: int = 200) -> web.Response:
    return web.Response(status=status, body=body, headers={"NVCF-REQID": "r-1"})


def test_the_answer_is_passed_on_byte_for_byte_inside_the_wrapper() -> None:
    body = b'{"text": "h\\u00e9", "n": 1.0e0, "list": [1, 2]}'
    wrapped = wrap(answer(body))
    assert wrapped.status == 200
    assert isinstance(wrapped.body, bytes)
    assert json.loads(wrapped.body) == {
        "reqId": "r-1",
        "status": "fulfilled",
        "percentComplete": 100,
        "response": {"text": "hé", "n": 1.0, "list": [1, 2]},
    }
    assert wrapped.body.endswith(b'"response":' + body + b"}")  # as the function wrote it


@pytest.mark.parametrize("body", [b"not json", b'{"a": [1,}', b"[" * 100_000 + b"]" * 100_000, b""])
def test_an_answer_that_is_not_json_is_an_error_that_says_so(body: bytes) -> None:
    with pytest.raises(ProblemError) as refused:
        wrap(answer(body))
    assert refused.value.status == 500 and "not JSON" in refused.value.detail
    assert refused.value.headers["NVCF-REQID"] == "r-1"


def test_an_answer_of_many_small_objects_costs_its_bytes() -> None:
    body = b"[" + b",".join([b"{}"] * ((3 << 20) // 3)) + b"]"  # decoded, about 75 MB of objects
    tracemalloc.start()
    try:
        wrapped = wrap(answer(body))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert isinstance(wrapped.body, bytes) and body in wrapped.body
    assert peak < 3 * len(body), peak
