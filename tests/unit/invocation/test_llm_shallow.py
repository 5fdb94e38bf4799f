"""The gateway reads an OpenAI body one level deep: what it forwards is what came, and a hostile body costs
no more memory than its own bytes.
"""

from __future__ import annotations

import tracemalloc

import pytest

from nvcf_mono.planes.invocation.llm.limits import estimate_tokens
from nvcf_mono.planes.invocation.llm.shallow import MOST_DECODED, NotJson, ShallowObject
from nvcf_mono.planes.invocation.llm.usage import UsageMeter


def test_members_are_read_when_asked_and_forwarded_as_they_came() -> None:
    raw = (
        b'{"model": "acme/llama", "messages": [{"role": "user", "content": "h\\u00e9"}], "temperature": 1.0e0,\n'
        b' "max_tokens": 7}'
    )
    doc = ShallowObject.parse(raw)
    assert doc["model"] == "acme/llama" and doc.get("stream") is None and "stream" not in doc
    assert estimate_tokens(doc, len(raw)) == -(-len(raw) // 4) + 7
    doc.replace("model", "llama")
    # The model in its place, every other member byte for byte (1.0e0 stays 1.0e0, \u00e9 stays escaped).
    assert doc.encode() == (
        b'{"model":"llama","messages":[{"role": "user", "content": "h\\u00e9"}],"temperature":1.0e0,"max_tokens":7}'
    )


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        (b'{"model": "x", "messages": [1, 2,]}', "could not parse"),  # malformed deep inside: still caught
        (b'{"model": "x"} trailing', "could not parse"),
        (b'["model"]', "must be a JSON object"),
        (b'{"model": "x", "m": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "could not parse"),
        (b'{"model": NaN}', "could not parse"),
    ],
)
def test_what_is_not_a_json_object_is_refused_with_why(raw: bytes, said: str) -> None:
    with pytest.raises(NotJson) as refused:
        ShallowObject.parse(raw)
    assert said in str(refused.value)


def test_a_member_too_large_to_be_one_the_gateway_reads_reads_as_absent() -> None:
    huge = b'"' + b"m" * MOST_DECODED + b'"'
    doc = ShallowObject.parse(b'{"model": ' + huge + b', "stream": ' + b"[" + b"1," * MOST_DECODED + b"1]}")
    assert doc.get("model") is None  # the gateway then asks for a model
    assert "stream" in doc and doc.get("stream") is None  # there, and not a boolean: refused


def test_a_body_of_many_small_objects_costs_no_more_than_its_bytes() -> None:
    # Parsed whole, this body (16 MiB of "{}") took about 24 times its size and seconds of the event loop.
    objects = b",".join([b"{}"] * ((16 << 20) // 3))
    raw = b'{"model": "x", "messages": [' + objects + b"]}"
    tracemalloc.start()
    try:
        doc = ShallowObject.parse(raw)
        assert doc["model"] == "x"
        doc.replace("model", "y")
        kept, _ = tracemalloc.get_traced_memory()
        body = doc.encode()
    finally:
        tracemalloc.stop()
    assert kept < 64 * 1024, kept  # views of the body, not objects
    assert body == b'{"model":"y","messages":[' + objects + b"]}"


def test_the_usage_of_an_answer_of_many_small_objects_is_read_without_building_them() -> None:
    # A function's answer (a shared one's too) is searched for its usage: read one level deep, so an answer
    # of 3 MiB of "{}" (under the 4 MiB searched) costs its bytes, not 75 MB of objects.
    objects = b",".join([b"{}"] * ((3 << 20) // 3))
    answer = b'{"response": {"output": [' + objects + b'], "usage": {"input_tokens": 2, "output_tokens": 5}}}'
    meter = UsageMeter(streaming=False)
    meter.feed(answer)
    tracemalloc.start()
    try:
        assert meter.finish() == 7
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * len(answer), peak  # the copy of what was fed, and no objects
