"""The OpenAPI generator and the response checker catch what they exist to catch."""

from __future__ import annotations

import attrs
import pytest

from nvcf_mono.http.api import Call, Operation
from nvcf_mono.http.openapi import build_document
from nvcf_mono.models.common import KeyValue
from nvcf_mono.plugins import openapi as openapi_plugin
from nvcf_mono.structure import WireModel, wire
from nvcf_mono.testing.openapi import ResponseChecker


@wire
class Thing(WireModel):
    """A thing."""

    thing_id: str
    size: int | None = None
    pairs: tuple[KeyValue, ...] = ()


async def _handler(call: Call[None]) -> Thing:
    raise NotImplementedError


def _doc() -> ResponseChecker:
    op = Operation(method="GET", path="/things/{thingId}", handler=_handler, summary="s", tag="t", response=Thing)
    return ResponseChecker(build_document([op], title="t", version="0"))


def test_a_conforming_response_passes() -> None:
    checker = _doc()
    checker.check("GET", "/things/1", 200, "application/json", {"thingId": "1", "pairs": [{"key": "a", "value": "b"}]})
    assert checker.checked == 1


@pytest.mark.parametrize(
    "body",
    [
        {"thingId": "1", "extra": True},  # closed: an undocumented field fails
        {"size": 3},  # a required field missing
        {"thingId": 1},  # wrong type
        {"thingId": "1", "pairs": [{"key": "a"}]},  # nested schemas are checked too
    ],
)
def test_a_response_that_breaks_the_schema_fails(body: dict[str, object]) -> None:
    with pytest.raises(AssertionError, match="does not match /v3/openapi"):
        _doc().check("GET", "/things/1", 200, "application/json", body)


def test_undocumented_statuses_and_routes_fail() -> None:
    checker = _doc()
    with pytest.raises(AssertionError, match="does not document"):
        checker.check("GET", "/things/1", 409, "application/problem+json", {"status": 409, "title": "Conflict"})
    with pytest.raises(AssertionError, match="not in /v3/openapi"):
        checker.check("POST", "/things/1", 200, "application/json", {})
    checker.check("GET", "/nowhere", 404, "application/problem+json", {"status": 404, "title": "Not Found"})


def test_problem_bodies_are_closed_too() -> None:
    with pytest.raises(AssertionError, match="does not match"):
        _doc().check("GET", "/things/1", 400, "application/problem+json", {"status": 400, "title": "x", "trace": "..."})


async def _other_handler(call: Call[None]) -> Thing:
    raise NotImplementedError


def test_the_plugins_kept_document_follows_the_operations_not_their_handlers() -> None:
    """Hosts of one process share a built document only when they serve the same operations."""
    get = Operation(method="GET", path="/things/{thingId}", handler=_handler, summary="s", tag="t", response=Thing)
    same_elsewhere = Operation(
        method="GET", path="/things/{thingId}", handler=_other_handler, summary="s", tag="t", response=Thing
    )
    delete = Operation(method="DELETE", path="/things/{thingId}", handler=_handler, summary="d", tag="t", status=204)
    one = openapi_plugin._document([get])
    assert openapi_plugin._document([same_elsewhere]) is one  # another host's handler: the same document
    both = openapi_plugin._document([get, delete])
    assert both != one and b'"delete"' in both and b'"delete"' not in one
    described = openapi_plugin._document([attrs.evolve(get, summary="another summary")])
    assert b"another summary" in described and described != one
