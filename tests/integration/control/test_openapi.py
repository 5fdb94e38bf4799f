"""/v3/openapi: a valid OpenAPI 3.1 document that names every route the host serves."""

from __future__ import annotations

from pathlib import Path

import pytest
from openapi_spec_validator import validate

from nvcf_mono.console import ROUTES as CONSOLE_ROUTES
from nvcf_mono.http.openapi import path_template
from nvcf_mono.planes.invocation.llm.gateway import ROUTES as LLM_GATEWAY_ROUTES

from .conftest import CONTAINER_FUNCTION, platform


@pytest.mark.slow
async def test_the_document_is_valid_and_covers_every_route(tmp_path: Path) -> None:
    async with platform(tmp_path) as p:
        reply = await p.anonymous.get("/v3/openapi")
        assert reply.status == 200
        doc = reply.json
        validate(doc)  # OpenAPI 3.1 schema, including every JSON schema in it
        assert p.host.http is not None
        served = {
            (route.method.lower(), path_template(route.resource.canonical))
            for route in p.host.http.app.router.routes()
            if route.resource is not None
        }
        documented = {(method, path) for path, methods in doc["paths"].items() for method in methods}
        # Every GET answers HEAD as HTTP asks; a HEAD of its own (a status poll's look) is documented.
        served -= {("head", path) for method, path in served if method == "get"} - documented
        # The LLM gateway speaks OpenAI's API, documented by OpenAI (errors in its shape, not problem+json).
        served -= {(method.lower(), path_template(path)) for method, path in LLM_GATEWAY_ROUTES}
        # The console is a page and its files, not API operations (it calls the documented API).
        served -= {(method.lower(), path_template(path)) for method, path in CONSOLE_ROUTES}
        assert served - documented == set(), "routes missing from /v3/openapi"
        assert documented - served == set(), "documented routes the host does not serve"
        ids = [op["operationId"] for methods in doc["paths"].values() for op in methods.values()]
        assert len(ids) == len(set(ids)), "operation ids must be unique"


async def test_response_schemas_are_closed(tmp_path: Path) -> None:
    async with platform(tmp_path) as p:
        doc = (await p.anonymous.get("/v3/openapi")).json
        for name, schema in doc["components"]["schemas"].items():
            if not name.endswith("Input") and schema.get("type") == "object":
                assert schema.get("additionalProperties") is False, name
        created = await p.admin.post("/v2/nvcf/functions", CONTAINER_FUNCTION)
        assert created.status == 200
        assert p.admin.checker is not None and p.admin.checker.checked >= 1
