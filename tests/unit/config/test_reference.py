"""config/reference.yaml documents every key with its default and is generated, never hand-edited."""

from __future__ import annotations

from pathlib import Path

import attrs

from nvcf_mono.config.model import Settings
from nvcf_mono.config.reference import render_reference
from nvcf_mono.registry import discover
from nvcf_mono.structure import DOC

ROOT = Path(__file__).resolve().parents[3]


def test_reference_yaml_is_current() -> None:
    catalog, issues = discover()
    assert issues == []
    committed = (ROOT / "config" / "reference.yaml").read_text()
    assert committed == render_reference(catalog), "config/reference.yaml is stale: run `make reference`"


def test_every_setting_is_documented() -> None:
    undocumented = []

    def walk(cls: type, prefix: str) -> None:
        for field in attrs.fields(cls):
            if not field.metadata.get(DOC):
                undocumented.append(prefix + field.name)
            default = field.default
            if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
                default = default.factory()  # type: ignore[misc]
            if attrs.has(type(default)):
                walk(type(default), f"{prefix}{field.name}.")

    walk(Settings, "")
    assert undocumented == []
