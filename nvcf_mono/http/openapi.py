"""The OpenAPI 3.1 document, generated from the declared operations and their attrs types.

Response schemas are closed (``additionalProperties: false``): a field the code returns but the
document does not name fails the schema test. Request schemas are open, because NVCF ignores
unknown request fields, and as strict as the server otherwise: required fields, enums (the server
also takes them in any case) and the bounds and patterns of each field's check, so a request the
document calls valid is one the server accepts in shape. Path ids carry the pattern every id has.
"""

from __future__ import annotations

import enum
import re
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal, Union, get_args, get_origin

import attrs

from nvcf_mono.contracts.ids import ID_MAX_LENGTH, ID_PATTERN
from nvcf_mono.http.api import Operation
from nvcf_mono.structure import BYTESIZE, CHECK, DURATION, check_schema, external_key, iter_fields

PROBLEM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "RFC 7807 problem details.",
    "properties": {
        "type": {"type": "string"},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string"},
        "instance": {"type": "string"},
        "validationErrors": {
            "type": "array",
            "items": {"type": "string"},
            "description": "An invalid Helm chart: each rule it breaks, in NVCF's words.",
        },
    },
    "required": ["title", "status"],
    "additionalProperties": False,
}

_ERROR_TEXT = {
    400: "Invalid request.",
    401: "Missing or invalid credential.",
    403: "The credential lacks a scope or resource.",
    404: "Not found (or owned by another account).",
    409: "Conflict.",
    413: "Too large.",
    429: "Too many requests.",
    500: "Internal error.",
    503: "Not ready; retry.",
}


class SchemaBuilder:
    """JSON Schema (2020-12) for attrs types, collected under ``components.schemas``."""

    def __init__(self) -> None:
        self.components: dict[str, dict[str, Any]] = {"Problem": PROBLEM_SCHEMA}
        self._names: dict[tuple[type, bool], str] = {}

    def ref(self, tp: type[Any], *, closed: bool) -> dict[str, Any]:
        return {"$ref": f"#/components/schemas/{self._define(tp, closed)}"}

    def _define(self, tp: type[Any], closed: bool) -> str:
        key = (tp, closed)
        if key in self._names:
            return self._names[key]
        name = tp.__name__ if closed else f"{tp.__name__}Input"
        taken = {n for k, n in self._names.items() if k != key}
        base, n = name, 2
        while name in taken:  # two classes of the same name in different modules
            name, n = f"{base}{n}", n + 1
        self._names[key] = name
        schema: dict[str, Any] = {"type": "object", "properties": {}}
        doc = (tp.__doc__ or "").strip().splitlines()
        if doc:
            schema["description"] = doc[0]
        self.components[name] = schema  # placed first: recursive types refer to it
        required = []
        for field, hint in iter_fields(tp):
            key_name = external_key(field)
            prop = self.schema(hint, closed=closed)
            if not closed:
                prop = constrain(prop, check_schema(field.metadata.get(CHECK)))
            schema["properties"][key_name] = prop
            if field.default is attrs.NOTHING:
                required.append(key_name)
        if required:
            schema["required"] = required
        schema["additionalProperties"] = not closed
        return name

    def schema(self, tp: Any, *, closed: bool) -> dict[str, Any]:
        origin = get_origin(tp)
        if origin is typing.Annotated:
            base, *extras = get_args(tp)
            if DURATION in extras:
                return {"type": ["number", "string"], "description": "seconds, or a duration such as 30s or PT30S"}
            if BYTESIZE in extras:
                return {"type": ["integer", "string"], "description": "bytes, or a size such as 64MiB"}
            return self.schema(base, closed=closed)
        if tp is Any or tp is object:
            return {}
        if origin in (Union, types.UnionType):
            members = [m for m in get_args(tp) if m is not type(None)]
            nullable = len(members) < len(get_args(tp))
            inner = (
                self.schema(members[0], closed=closed)
                if len(members) == 1
                else {"anyOf": [self.schema(m, closed=closed) for m in members]}
            )
            # Responses omit nulls; requests may send them.
            return {"anyOf": [inner, {"type": "null"}]} if nullable and not closed else inner
        if origin is Literal:
            return {"enum": list(get_args(tp))}
        if attrs.has(tp):
            return self.ref(tp, closed=closed)
        if isinstance(tp, type) and issubclass(tp, enum.Enum):
            values = [m.value for m in tp]
            if closed:
                return {"type": "string", "enum": values}
            return {"type": "string", "enum": values, "description": "matched in any case"}
        if tp is bool:
            return {"type": "boolean"}
        if tp is int:
            return {"type": "integer"}
        if tp is float:
            return {"type": "number"}
        if tp is str:
            return {"type": "string"}
        if origin in (tuple, list, frozenset, set, Sequence):
            args = get_args(tp)
            items = self.schema(args[0], closed=closed) if args else {}
            out: dict[str, Any] = {"type": "array", "items": items}
            if origin in (frozenset, set):
                out["uniqueItems"] = True
            return out
        if origin in (dict, Mapping) or tp in (dict, Mapping):
            args = get_args(tp)
            return {"type": "object", "additionalProperties": self.schema(args[1], closed=closed) if args else {}}
        raise TypeError(f"no JSON schema for {tp!r}")


def constrain(schema: dict[str, Any], keywords: Mapping[str, Any]) -> dict[str, Any]:
    """``schema`` with a check's keywords added (to the non-null member of a nullable one; ``items`` merged)."""
    if not keywords:
        return schema
    if "anyOf" in schema:
        members = [m if m.get("type") == "null" else constrain(m, keywords) for m in schema["anyOf"]]
        return {**schema, "anyOf": members}
    out = dict(schema)
    for key, value in keywords.items():
        if key == "items" and isinstance(out.get("items"), dict):
            out["items"] = {**out["items"], **value}
        else:
            out[key] = value
    return out


_PATH_PARAM = re.compile(r"\{([^}/]+)\}")
#: Every path id (see ``nvcf_mono.contracts.ids``; anything else is a 400).
PATH_ID_SCHEMA = {"type": "string", "pattern": ID_PATTERN, "maxLength": ID_MAX_LENGTH}


def path_template(path: str) -> str:
    """Aiohttp's ``{name:regex}`` -> OpenAPI's ``{name}``."""
    return _PATH_PARAM.sub(lambda m: "{" + m.group(1).split(":", 1)[0] + "}", path)


def _problem(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}},
    }


def build_document(
    operations: Iterable[Operation],
    *,
    title: str,
    version: str,
    extra_paths: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """The whole document."""
    builder = SchemaBuilder()
    paths: dict[str, dict[str, Any]] = {}
    for op in sorted(operations, key=lambda o: (o.path, o.method)):
        paths.setdefault(path_template(op.path), {})[op.method.lower()] = _operation(op, builder)
    for template, methods in (extra_paths or {}).items():
        for method, entry in methods.items():
            paths.setdefault(template, {})[method] = dict(entry)
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version},
        "jsonSchemaDialect": "https://json-schema.org/draft/2020-12/schema",
        "paths": paths,
        "components": {
            "schemas": builder.components,
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "An nvapi- API key, a JWT, or the admin token.",
                }
            },
        },
    }


def _operation(op: Operation, builder: SchemaBuilder) -> dict[str, Any]:
    """One operation's entry: what it is, who may call it, what it takes and what it answers."""
    entry: dict[str, Any] = {
        "operationId": f"{op.operation_id}{'AnyAccount' if op.twin else ''}",
        "summary": op.summary,
        "tags": [op.tag],
    }
    if op.description:
        entry["description"] = op.description
    if op.deprecated:
        entry["deprecated"] = True
    if op.auth == "required":
        entry["security"] = [{"bearer": []}]
        if op.scopes:
            entry["x-scopes"] = list(op.scopes)
    else:
        entry["security"] = []
    params = [
        {"name": name, "in": "path", "required": True, "schema": dict(PATH_ID_SCHEMA)}
        for name in (m.group(1).split(":", 1)[0] for m in _PATH_PARAM.finditer(op.path))
    ]
    params += [
        {
            "name": p.name,
            "in": p.location,
            "required": p.required,
            "description": p.description,
            "schema": dict(p.schema),
        }
        for p in op.params
    ]
    if params:
        entry["parameters"] = params
    if op.body is not None:
        entry["requestBody"] = {
            "required": not op.body_optional,
            "content": {"application/json": {"schema": builder.ref(op.body, closed=False)}},
        }
    elif op.raw_body is not None:
        entry["requestBody"] = {
            "required": True,
            "content": {op.raw_body: {"schema": {"type": "string", "contentMediaType": "application/octet-stream"}}},
        }
    if op.passthrough and op.response is None:
        entry["x-passthrough"] = True
    entry["responses"] = _responses(op, builder)
    return entry


def _responses(op: Operation, builder: SchemaBuilder) -> dict[str, Any]:
    """Its success answer and every error it may give (problem+json)."""
    responses: dict[str, Any] = {}
    if op.response is not None:
        responses[str(op.status)] = {
            "description": "Success.",
            "content": {"application/json": {"schema": builder.schema(op.response, closed=True)}},
        }
    elif op.passthrough:
        # The function's own answer, any status: documented as a pass-through.
        responses["default"] = {
            "description": "The function's response (status, headers and body) passed through.",
            "content": {"*/*": {"schema": {}}},
        }
    elif op.raw_response is not None:
        responses[str(op.status)] = {"description": "Success.", "content": {op.raw_response: {"schema": {}}}}
    else:
        responses[str(op.status if op.status != 200 else 204)] = {"description": "Done; no content."}
    codes = set(op.errors) | {400, 500, 503}  # 503: the plugin serving it is not running (yet)
    if op.auth == "required":
        codes |= {401, 403, 404}  # 404: a JWT whose client id no account knows
    if op.body is not None or op.raw_body is not None:
        codes.add(413)  # a body over http.max_request_body
    for code in sorted(codes):
        responses[str(code)] = _problem(_ERROR_TEXT.get(code, "Error."))
    if op.response is not None and op.passthrough:
        # A typed wrapper around the function's answer (exec): the same body with the function's status.
        wrapped = {"application/json": {"schema": builder.schema(op.response, closed=True)}}
        for code in codes:
            responses[str(code)]["content"] = {**responses[str(code)]["content"], **wrapped}
        responses["default"] = {"description": "The same, with the function's own status.", "content": wrapped}
    return responses
