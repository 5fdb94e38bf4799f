"""Plugin ``openapi``: ``GET /v3/openapi``, the OpenAPI 3.1 document of every operation this node serves."""

from __future__ import annotations

import json
from typing import Any, ClassVar

import attrs
from aiohttp import web
from anyio.abc import TaskStatus

from nvcf_mono import __version__
from nvcf_mono.http.api import API_OPERATIONS, Call, Operation
from nvcf_mono.http.openapi import build_document
from nvcf_mono.plugin import BasePlugin, NoConfig, PluginSpec, RunContext, SetupContext

OPENAPI_PATH = "/v3/openapi"

_HOST_ROUTES: dict[str, dict[str, Any]] = {
    "/health": {
        "get": {
            "operationId": "health",
            "summary": "Liveness of this node.",
            "tags": ["host"],
            "security": [],
            "responses": {
                "200": {
                    "description": "Alive.",
                    "content": {
                        "application/json": {
                            "schema": {
                                "type": "object",
                                "properties": {"status": {"type": "string"}},
                                "required": ["status"],
                                "additionalProperties": False,
                            }
                        }
                    },
                }
            },
        }
    },
    "/ready": {
        "get": {
            "operationId": "ready",
            "summary": "Readiness: every enabled plugin runs and the bus is connected (503 otherwise).",
            "tags": ["host"],
            "security": [],
            "responses": {
                code: {
                    "description": text,
                    "content": {
                        "application/json": {
                            "schema": {
                                "type": "object",
                                "properties": {
                                    "status": {"type": "string"},
                                    "role": {"type": "string"},
                                    "node": {"type": "string"},
                                    "bus": {"type": "string"},
                                    "plugins": {"type": "object"},
                                },
                                "required": ["status", "plugins"],
                                "additionalProperties": False,
                            }
                        }
                    },
                }
                for code, text in (("200", "Ready."), ("503", "Not ready; `plugins` says why."))
            },
        }
    },
    "/metrics": {
        "get": {
            "operationId": "metrics",
            "summary": "Prometheus metrics of this node.",
            "tags": ["host"],
            "security": [],
            "responses": {"200": {"description": "Text exposition 0.0.4.", "content": {"text/plain": {"schema": {}}}}},
        }
    },
    OPENAPI_PATH: {
        "get": {
            "operationId": "openapi",
            "summary": "This document.",
            "tags": ["host"],
            "security": [],
            "responses": {"200": {"description": "OpenAPI 3.1.", "content": {"application/json": {"schema": {}}}}},
        }
    },
}


class OpenApi(BasePlugin[NoConfig]):
    """Plugin ``openapi``."""

    spec: ClassVar[PluginSpec] = PluginSpec(
        name="openapi",
        description="Serves /v3/openapi: the OpenAPI 3.1 document of this node's API.",
        roles=frozenset({"all-in-one", "control", "invocation"}),
        config_type=NoConfig,
    )

    def setup(self, ctx: SetupContext) -> None:
        self._body = b""
        ctx.add_route("GET", OPENAPI_PATH, self.document)

    async def run(self, ctx: RunContext[NoConfig], *, task_status: TaskStatus[None]) -> None:
        operations = [ext.value for ext in ctx.services.extensions(API_OPERATIONS)]
        self._body = _document(operations)
        task_status.started()
        await ctx.wait_stopping()

    async def document(self, request: web.Request) -> web.Response:
        return web.Response(body=self._body, content_type="application/json")


async def _not_called(call: Call[Any]) -> None:
    raise AssertionError("a stand-in for handlers in a document's key")


#: Encoded documents by what they are built from (few: the hosts of one process serve the same operations).
_DOCUMENTS: dict[str, bytes] = {}


def _document(operations: list[Operation]) -> bytes:
    """The document, encoded; kept, as hosts started in one process (a test process starts hundreds) serve
    the same operations and building it was most of this plugin's start. Keyed by the operations' repr
    without their handlers, which are bound to each host's plugins and say nothing the document shows (a
    ``Param`` holds a schema dict, so the operations themselves are not hashable).
    """
    key = repr([attrs.evolve(op, handler=_not_called) for op in operations])
    body = _DOCUMENTS.get(key)
    if body is None:
        doc = build_document(operations, title="nvcf-mono", version=__version__, extra_paths=_HOST_ROUTES)
        body = json.dumps(doc, separators=(",", ":")).encode()
        if len(_DOCUMENTS) >= 4:
            _DOCUMENTS.clear()
        _DOCUMENTS[key] = body
    return body
