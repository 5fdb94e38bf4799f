"""Render ``config/reference.yaml``: every key with its default and documentation, from the attrs types."""

from __future__ import annotations

import textwrap
import typing
from collections.abc import Mapping
from typing import Any, get_args, get_origin

import attrs
import yaml

from nvcf_mono.config.model import CONFIG_SCHEMA_VERSION, Settings
from nvcf_mono.registry import Catalog
from nvcf_mono.structure import DOC, external_key, field_types, unstructure

HEADER = """\
# nvcf-mono configuration reference: every key, its default, and what it does.
# Generated from the settings types by `nvcf-mono config reference`; do not edit by hand
# (a test fails when it is out of date). Copy the keys you need into your own file.
#
# Precedence: these defaults < --config files (deep-merged, in order) < environment
# NVCF_MONO__SECTION__KEY=value (e.g. NVCF_MONO__HTTP__PORT=9000) < --set key.path=value flags.
# Durations take 500ms, 30s, 5m, 1h or a number of seconds; sizes take 64MiB, 1GB or bytes.
"""


def _scalar(value: Any) -> str:
    text = yaml.safe_dump(unstructure(value), default_flow_style=True, width=1 << 16).strip()
    return text.removesuffix("\n...").removesuffix("...").strip()


def _comment(text: str, indent: str) -> list[str]:
    return [f"{indent}# {line}" for line in textwrap.wrap(text, width=max(40, 100 - len(indent)))]


def _unwrap(tp: Any) -> Any:
    if get_origin(tp) is typing.Annotated:
        return get_args(tp)[0]
    return tp


def _mapping_item(tp: Any) -> type | None:
    """The attrs value type of ``Mapping[str, X]``, if that is what ``tp`` is."""
    if get_origin(tp) in (dict, Mapping):
        args = get_args(tp)
        if len(args) == 2 and attrs.has(_unwrap(args[1])):
            return typing.cast(type, _unwrap(args[1]))
    return None


def _sequence_item(tp: Any) -> type | None:
    """The attrs item type of ``tuple[X, ...]``, if that is what ``tp`` is."""
    if get_origin(tp) in (tuple, list):
        args = get_args(tp)
        if args and attrs.has(_unwrap(args[0])):
            return typing.cast(type, _unwrap(args[0]))
    return None


def render_attrs(cls: type, default: Any, indent: str) -> list[str]:
    """Lines for each field of ``cls``, with ``default`` the instance holding the defaults."""
    lines: list[str] = []
    types = field_types(cls)
    for field in attrs.fields(cls):
        doc = field.metadata.get(DOC, "")
        value = getattr(default, field.name)
        tp = _unwrap(types[field.name])
        if doc:
            lines.extend(_comment(doc, indent))
        key = external_key(field)
        if attrs.has(tp) and attrs.fields(tp):
            lines.append(f"{indent}{key}:")
            lines.extend(render_attrs(tp, value, indent + "  "))
        else:
            lines.append(f"{indent}{key}: {_scalar(value)}")
            item = _sequence_item(tp)
            try:
                example = item() if item is not None else None
            except TypeError:
                example = None  # items without defaults for every field are documented by their owner
            if item is not None and example is not None:
                lines.extend(_comment(f"Each item is {item.__name__}: {item.__doc__ or ''}", indent))
                lines.append(f"{indent}#   -")
                nested = render_attrs(item, example, indent + "     ")
                lines.extend(f"{indent}#{line[len(indent) :]}" for line in nested)
    return lines


def render_reference(catalog: Catalog) -> str:
    """The whole reference document."""
    lines = [HEADER.rstrip("\n"), "", "# Schema version of this file.", f"version: {CONFIG_SCHEMA_VERSION}"]
    lines.extend(render_attrs(Settings, Settings(), ""))
    lines.append("")
    lines.append("# Per-plugin settings. `enabled: null` leaves the choice to the role; true/false overrides it.")
    lines.append("plugins:")
    for name, cls in sorted(catalog.plugins.items()):
        spec = cls.spec
        lines.extend(_comment(spec.description, "  "))
        roles = ", ".join(sorted(spec.roles)) or "none (enable it explicitly)"
        lines.append(f"  {name}:")
        lines.extend(_comment(f"Enabled by the roles: {roles}.", "    "))
        lines.append("    enabled: null")
        lines.extend(render_attrs(spec.config_type, spec.config_type(), "    "))
    owned = sorted((key, name, tp) for name, cls in catalog.plugins.items() for key, tp in cls.spec.sections.items())
    for key, owner, tp in owned:
        lines.append("")
        lines.extend(_comment(f"Owned by the {owner} plugin.", ""))
        tp = _unwrap(tp)
        if attrs.has(tp):
            lines.append(f"{key}:")
            lines.extend(render_attrs(tp, tp(), "  "))
        else:
            lines.append(f"{key}: {{}}")
            item = _mapping_item(tp)
            if item is not None:
                lines.extend(_comment(f"Each entry maps a name to {item.__name__}: {item.__doc__ or ''}", ""))
                try:
                    example = item()
                except TypeError:
                    example = None
                if example is not None:
                    lines.append("#   <name>:")
                    lines.extend("#" + line[1:] for line in render_attrs(item, example, "      "))
    return "\n".join(lines) + "\n"
