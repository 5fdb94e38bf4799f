"""Nested mappings merged the way layered YAML is: mappings key by key, anything else replaced."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def deep_merged(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``over`` laid on top; neither is changed."""
    out = dict(base)
    for key, value in over.items():
        current = out.get(key)
        if isinstance(value, Mapping) and isinstance(current, Mapping):
            out[key] = deep_merged(current, value)
        else:
            out[key] = value
    return out
