"""Layered mappings: nested keys merged, anything else replaced, the inputs untouched."""

from __future__ import annotations

from nvcf_mono.mappings import deep_merged


def test_nested_mappings_merge_and_other_values_are_replaced_without_changing_the_inputs() -> None:
    base = {"a": {"b": 1, "c": [1]}, "d": 1}
    over = {"a": {"c": [2], "e": {"f": 1}}, "d": {"now": "a mapping"}}
    assert deep_merged(base, over) == {"a": {"b": 1, "c": [2], "e": {"f": 1}}, "d": {"now": "a mapping"}}
    assert base == {"a": {"b": 1, "c": [1]}, "d": 1} and over["a"] == {"c": [2], "e": {"f": 1}}
