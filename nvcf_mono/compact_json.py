"""Compact JSON bytes: orjson's encoder, and the standard library's for what orjson refuses."""

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
