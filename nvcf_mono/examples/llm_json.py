"""What the tiny example model writes when a chat asks for JSON (OpenAI's ``response_format``).

``{"type": "json_object"}`` gets an object holding the model's words; ``{"type": "json_schema",
"json_schema": {"name", "schema"}}`` gets a value of that schema, drawn from the same seeded generator
as the words, so the same request always gets the same value. Enough of JSON Schema is read for what
clients generate (OpenAI's SDK from a Pydantic model: objects, arrays, ``$ref`` to ``$defs``, ``anyOf``
for optional fields, enums, the common string formats); anything else reads as a string.
"""

from __future__ import annotations

import json
import math
import random
import uuid
from collections.abc import Mapping
from typing import Any

#: Past this depth a schema (a recursive one) is answered with null.
MAX_DEPTH = 8
#: Fixed values for string formats a client may validate.
FORMATS = {
    "date-time": "2026-01-01T00:00:00Z",
    "date": "2026-01-01",
    "time": "00:00:00",
    "email": "someone@example.com",
    "uri": "https://example.com/",
    "hostname": "example.com",
}


class FormatError(ValueError):
    """``response_format`` is not one this model can follow (a 400 naming it)."""


def wanted_schema(doc: Mapping[str, Any]) -> dict[str, Any] | None:
    """The JSON the call asks for: a schema (``{}`` for any object), or None for plain text."""
    fmt = doc.get("response_format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object", "properties": {"answer": {"type": "string"}}}
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        schema = spec.get("schema", {}) if isinstance(spec, dict) else None
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) or not isinstance(schema, dict):
            raise FormatError("'response_format.json_schema' must be an object with a 'name' and a 'schema' object")
        return schema
    raise FormatError("'response_format' must be an object whose 'type' is 'text', 'json_object' or 'json_schema'")


def json_answer(schema: dict[str, Any], rng: random.Random, words: tuple[str, ...]) -> str:
    """A value of ``schema`` as JSON text."""
    defs: dict[str, Any] = {}
    for key in ("definitions", "$defs"):
        found = schema.get(key)
        defs.update(found if isinstance(found, dict) else {})
    return json.dumps(_value(schema, rng, words, defs, 0))


def _number(schema: dict[str, Any], key: str, default: float) -> float:
    """A bound of the schema when it is a finite number (a tenant's schema may hold anything)."""
    value = schema.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return default
    return float(value)


def _value(schema: Any, rng: random.Random, words: tuple[str, ...], defs: dict[str, Any], depth: int) -> Any:
    if not isinstance(schema, dict) or depth > MAX_DEPTH:
        return None
    ref = schema.get("$ref")
    if isinstance(ref, str):
        return _value(defs.get(ref.rsplit("/", 1)[-1]), rng, words, defs, depth + 1)
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return rng.choice(schema["enum"])
    for key in ("anyOf", "oneOf", "allOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            real = [o for o in options if not (isinstance(o, dict) and o.get("type") == "null")]
            return _value((real or options)[0], rng, words, defs, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object" or "properties" in schema:
        properties = schema.get("properties")
        items = properties.items() if isinstance(properties, dict) else ()
        return {name: _value(sub, rng, words, defs, depth + 1) for name, sub in items}
    if kind == "array":
        count = max(1, min(int(_number(schema, "minItems", 1)), 3))
        return [_value(schema.get("items", {}), rng, words, defs, depth + 1) for _ in range(count)]
    return _scalar(kind, schema, rng, words)


def _scalar(kind: Any, schema: dict[str, Any], rng: random.Random, words: tuple[str, ...]) -> Any:
    low = _number(schema, "minimum", 0.0)
    high = max(low, _number(schema, "maximum", max(low, 100.0)))
    if kind == "integer":
        first = math.ceil(low)
        return rng.randint(first, max(first, math.floor(high)))
    if kind == "number":
        return round(rng.uniform(low, high), 2)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "null":
        return None
    fmt = schema.get("format")
    if fmt == "uuid":
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))
    return FORMATS.get(fmt) if fmt in FORMATS else " ".join(rng.choice(words) for _ in range(2))


def pieces(text: str) -> list[str]:
    """The JSON text as the tokens a stream sends: split at its spaces, each space kept with what follows."""
    parts = text.split(" ")
    return [parts[0], *(" " + part for part in parts[1:])]
