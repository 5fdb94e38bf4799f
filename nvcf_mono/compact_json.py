"""JSON as bytes, fast: orjson, and the standard library for what orjson refuses."""

from __future__ import annotations

import json
from typing import Any

import orjson


def dumps(value: Any) -> bytes:
    """``value`` as compact JSON.

    orjson is several times faster; it refuses a string holding a lone surrogate (from undecodable
    bytes), an integer past 64 bits and a key that is not a string, which the standard library writes.
    """
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:
        return json.dumps(value, separators=(",", ":")).encode()


def loads(data: bytes | str) -> Any:
    """The value ``data`` holds; raises ValueError when it is not JSON.

    What :func:`dumps` wrote with the standard library (an escaped lone surrogate, a large integer)
    orjson refuses to read: the standard library reads it.
    """
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)
