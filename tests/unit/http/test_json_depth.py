"""The nesting check on JSON bodies: exact at its limit, and cheap on a body of many small values."""

from __future__ import annotations

import json
from typing import Any

import pytest

from nvcf_mono.http.api import MAX_JSON_DEPTH, _depth_within


def nested(kind: str, depth: int) -> Any:
    text = "[" * depth + "]" * depth if kind == "array" else '{"a":' * depth + "1" + "}" * depth
    return json.loads(text)


@pytest.mark.parametrize("kind", ["array", "object"])
def test_the_limit_is_exact(kind: str) -> None:
    assert _depth_within(nested(kind, MAX_JSON_DEPTH), MAX_JSON_DEPTH)
    assert not _depth_within(nested(kind, MAX_JSON_DEPTH + 1), MAX_JSON_DEPTH)


def test_scalars_empty_containers_and_mixed_documents() -> None:
    assert _depth_within(1, 1) and _depth_within("x", 1) and _depth_within(None, 1)
    assert _depth_within({}, 1) and _depth_within([], 1)
    assert not _depth_within([[]], 1) and _depth_within([[]], 2)  # an empty container is a level too
    doc = {"a": [1, {"b": [None, {"c": {}}]}], "d": "e"}  # depth 6: {} [ {} [ {} {}
    assert _depth_within(doc, 6) and not _depth_within(doc, 5)


def test_a_wide_body_is_judged_by_its_deepest_value() -> None:
    # 2 MiB of "{}" (walked a level at a time: 0.05 s here where a loop turn per value took 0.76 s).
    doc = json.loads('{"a":[' + ",".join(["{}"] * ((2 << 20) // 3)) + '], "b": [[[[1]]]]}')
    assert _depth_within(doc, 5) and not _depth_within(doc, 4)
