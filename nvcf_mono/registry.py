"""Find plugin classes (entry points and ``module:Class`` refs), check their specs, order them."""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from graphlib import CycleError, TopologicalSorter
from importlib.metadata import entry_points
from typing import Any

import attrs

from nvcf_mono.plugin import Plugin, PluginSpec
from nvcf_mono.structure import Issue

ENTRY_POINT_GROUP = "nvcf_mono.plugins"
NAME_RX = re.compile(r"[a-z][a-z0-9_]*")


@attrs.frozen
class Catalog:
    """Every plugin available to this installation, by name, with where each came from."""

    plugins: Mapping[str, type[Plugin]]
    origins: Mapping[str, str]

    def spec(self, name: str) -> PluginSpec:
        return self.plugins[name].spec


def spec_problems(cls: Any, expected_name: str | None = None) -> list[str]:
    """What is wrong with a plugin class, as readable sentences (empty when it is fine)."""
    problems: list[str] = []
    spec = getattr(cls, "spec", None)
    if not isinstance(spec, PluginSpec):
        return [f"{cls!r} has no `spec: ClassVar[PluginSpec]`"]
    if not NAME_RX.fullmatch(spec.name):
        problems.append(f"name {spec.name!r} must be lowercase letters, digits and '_' (it is a config key)")
    if expected_name is not None and spec.name != expected_name:
        problems.append(f"entry point {expected_name!r} names a plugin whose spec.name is {spec.name!r}")
    if not attrs.has(spec.config_type):
        problems.append(f"config_type {spec.config_type!r} is not an attrs class")
    elif not _is_frozen(spec.config_type):
        problems.append(f"config_type {spec.config_type.__name__} must be frozen (attrs.frozen)")
    if spec.name in spec.requires or spec.name in spec.after:
        problems.append("a plugin cannot depend on itself")
    for method in ("setup", "run"):
        if not callable(getattr(cls, method, None)):
            problems.append(f"missing method {method}()")
    if callable(getattr(cls, "setup", None)) and inspect.iscoroutinefunction(cls.setup):
        problems.append("setup() must be synchronous (it declares; run() does I/O)")
    if callable(getattr(cls, "run", None)) and not inspect.iscoroutinefunction(cls.run):
        problems.append("run() must be async")
    elif callable(getattr(cls, "run", None)):
        params = inspect.signature(cls.run).parameters
        status = params.get("task_status")
        if status is None or status.kind is not inspect.Parameter.KEYWORD_ONLY:
            problems.append("run() must take a keyword-only task_status")
    return problems


def _is_frozen(cls: type) -> bool:
    # attrs gives frozen classes a __setattr__ that raises FrozenInstanceError.
    return getattr(cls.__setattr__, "__name__", "") == "_frozen_setattrs"


def _load(target: str) -> Any:
    module_name, _, attr = target.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def discover(extra: Sequence[str] = (), *, skip: Collection[str] = ()) -> tuple[Catalog, list[Issue]]:
    """Load every ``nvcf_mono.plugins`` entry point plus ``extra`` refs; names in ``skip`` are not imported."""
    plugins: dict[str, type[Plugin]] = {}
    origins: dict[str, str] = {}
    issues: list[Issue] = []

    def add(name: str | None, target: str, origin: str) -> None:
        try:
            cls = _load(target)
        except Exception as err:  # a broken plugin is reported, not raised through
            issues.append(
                Issue(
                    f"plugins.{name}" if name else "extra_plugins",
                    f"cannot load {origin} {target!r}: {type(err).__name__}: {err}",
                )
            )
            return
        problems = spec_problems(cls, name)
        if problems:
            issues.append(
                Issue(
                    f"plugins.{name or getattr(getattr(cls, 'spec', None), 'name', target)}",
                    f"{origin} {target!r} is not a valid plugin: {'; '.join(problems)}",
                )
            )
            return
        spec_name = cls.spec.name
        if spec_name in plugins and plugins[spec_name] is not cls:
            issues.append(
                Issue(
                    f"plugins.{spec_name}",
                    f"two plugins are named {spec_name!r}: {origins[spec_name]} and {origin} {target!r}",
                )
            )
            return
        plugins[spec_name] = cls
        origins[spec_name] = f"{origin} {target}"

    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        if ep.name in skip:
            continue
        add(ep.name, ep.value, "entry point")
    for target in extra:
        add(None, target, "extra_plugins")
    return Catalog(plugins=plugins, origins=origins), issues


def start_order(specs: Mapping[str, PluginSpec]) -> tuple[list[str], list[Issue]]:
    """Topological order over ``requires`` and ``after`` (among the given plugins), ties by name."""
    graph = TopologicalSorter({name: {d for d in (*s.requires, *s.after) if d in specs} for name, s in specs.items()})
    order: list[str] = []
    try:
        graph.prepare()
    except CycleError as err:
        cycle = ", ".join(sorted(set(err.args[1])))
        return order, [Issue("plugins", f"dependency cycle among plugins: {cycle}")]
    while graph.is_active():
        ready = sorted(graph.get_ready())
        order.extend(ready)
        graph.done(*ready)
    return order, []


def roles_of(catalog: Catalog, builtin: Iterable[str]) -> list[str]:
    """Every role name known to this installation."""
    known = set(builtin)
    for cls in catalog.plugins.values():
        known |= set(cls.spec.roles)
    return sorted(known)
