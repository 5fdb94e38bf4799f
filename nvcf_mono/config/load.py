"""Resolve the configuration: attrs defaults < YAML files (deep-merged, in order) < env < CLI flags.

Every problem is collected before anything starts (no I/O happens first), and each names the dotted
path, the reason, and the source that supplied the value.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import yaml

from nvcf_mono.config.model import CONFIG_SCHEMA_VERSION, Settings
from nvcf_mono.errors import NvcfMonoError
from nvcf_mono.plugin import BUILTIN_ROLES, Plugin, PluginSpec
from nvcf_mono.registry import Catalog, discover, roles_of, start_order
from nvcf_mono.structure import Issue, StructureError, Text, structure, unknown_key_hint, unstructure

ENV_PREFIX = "NVCF_MONO__"


class ConfigError(NvcfMonoError):
    """The configuration cannot be used; ``issues`` lists every problem, one line each."""

    def __init__(self, issues: Sequence[Issue]) -> None:
        self.issues = tuple(issues)
        super().__init__("\n".join(str(i) for i in self.issues))


@attrs.frozen(kw_only=True)
class ConfigSources:
    """Where configuration comes from, lowest precedence first (after the built-in defaults)."""

    files: tuple[Path, ...] = ()
    environ: Mapping[str, str] = attrs.field(factory=dict)
    #: (dotted path, text, label), e.g. ("http.port", "0", "--set http.port=0")
    overrides: tuple[tuple[str, str, str], ...] = ()


@attrs.frozen(kw_only=True)
class PluginEntry:
    """One available plugin: its class, its structured config, and whether (and why) it is enabled."""

    name: str
    cls: type[Plugin]
    config: Any
    enabled: bool
    why: str
    origin: str

    @property
    def spec(self) -> PluginSpec:
        return self.cls.spec


@attrs.frozen(kw_only=True)
class ResolvedConfig:
    """The effective configuration the host is built from."""

    settings: Settings
    plugins: Mapping[str, PluginEntry]
    order: tuple[str, ...]  # enabled plugins, in start order
    sections: Mapping[str, Any]
    catalog: Catalog

    @property
    def enabled(self) -> list[PluginEntry]:
        return [self.plugins[name] for name in self.order]

    def to_data(self, *, redact: bool = True) -> dict[str, Any]:
        """The whole effective configuration as plain data (``config show --resolved``)."""
        data: dict[str, Any] = {"version": CONFIG_SCHEMA_VERSION}
        data.update(unstructure(self.settings, redact=redact))
        data["plugins"] = {
            name: {"enabled": entry.enabled, **unstructure(entry.config, redact=redact)}
            for name, entry in sorted(self.plugins.items())
        }
        owners = {key: name for name, cls in self.catalog.plugins.items() for key in cls.spec.sections}
        for key, value in sorted(self.sections.items()):
            owner = self.plugins.get(owners.get(key, ""))
            if owner is not None and owner.enabled:  # a disabled plugin is not loaded: its section would not parse
                data[key] = unstructure(value, redact=redact)
        return data


# ---- raw layers -----------------------------------------------------------------------------------


def _merge(
    into: dict[str, Any],
    layer: Mapping[str, Any],
    prov: dict[tuple[str, ...], str],
    label: str,
    path: tuple[str, ...] = (),
) -> None:
    for key, value in layer.items():
        here = (*path, str(key))
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _merge(into[key], value, prov, label, here)
        elif isinstance(value, Mapping):
            into[key] = {}
            prov[here] = label
            _merge(into[key], value, prov, label, here)
        else:
            into[key] = value
            prov[here] = label


def _set_path(
    into: dict[str, Any], path: Sequence[str], value: Any, prov: dict[tuple[str, ...], str], label: str
) -> None:
    node = into
    for i, key in enumerate(path[:-1]):
        child = node.get(key)
        if not isinstance(child, dict):
            child = node[key] = {}
            prov[tuple(path[: i + 1])] = label
        node = child
    node[path[-1]] = value
    prov[tuple(path)] = label


def _read_file(path: Path, issues: list[Issue]) -> dict[str, Any] | None:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        issues.append(Issue("", f"cannot read config file {path}: {err.strerror or err}"))
        return None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err)
        issues.append(Issue("", f"{path}{where}: invalid YAML: {problem}"))
        return None
    if data is None:
        return {}
    if not isinstance(data, dict):
        issues.append(Issue("", f"{path}: the top level must be a mapping of keys, got {type(data).__name__}"))
        return None
    version = data.pop("version", CONFIG_SCHEMA_VERSION)
    if version != CONFIG_SCHEMA_VERSION:
        issues.append(
            Issue(
                "version",
                f"{path} has schema version {version!r}; this nvcf-mono reads version {CONFIG_SCHEMA_VERSION}",
            )
        )
        return None
    return data


def gather(sources: ConfigSources) -> tuple[dict[str, Any], dict[tuple[str, ...], str], list[Issue]]:
    """Merge files, env and overrides into one raw mapping, remembering where each value came from."""
    raw: dict[str, Any] = {}
    prov: dict[tuple[str, ...], str] = {}
    issues: list[Issue] = []
    for path in sources.files:
        data = _read_file(path, issues)
        if data is not None:
            _merge(raw, data, prov, str(path))
    for name in sorted(sources.environ):
        if not name.startswith(ENV_PREFIX):
            continue
        parts = [p.lower() for p in name[len(ENV_PREFIX) :].split("__")]
        if not parts or any(not p for p in parts):
            issues.append(Issue("", f"environment variable {name} is not NVCF_MONO__SECTION__KEY"))
            continue
        if parts == ["version"]:
            continue
        _set_path(raw, parts, Text(sources.environ[name]), prov, f"env {name}")
    for dotted, text, label in sources.overrides:
        parts = [p for p in dotted.split(".")]
        if not dotted or any(not p for p in parts):
            issues.append(Issue("", f"{label}: {dotted!r} is not a dotted config key"))
            continue
        _set_path(raw, parts, Text(text), prov, label)
    return raw, prov, issues


# ---- resolution -----------------------------------------------------------------------------------


def _settings_keys() -> set[str]:
    return {f.name for f in attrs.fields(Settings)}


def _structure_into(
    tp: Any, data: Any, path: tuple[str, ...], prov: Mapping[tuple[str, ...], str], issues: list[Issue]
) -> Any:
    try:
        return structure(tp, data, path=path, sources=prov)
    except StructureError as err:
        issues.extend(err.issues)
        return None


def load_config(sources: ConfigSources, *, catalog: Catalog | None = None) -> ResolvedConfig:
    """Build the effective configuration or raise :class:`ConfigError` listing every problem."""
    raw, prov, issues = gather(sources)
    core = {k: v for k, v in raw.items() if k in _settings_keys()}
    settings = _structure_into(Settings, core, (), prov, issues)

    plugins_raw = raw.get("plugins", {})
    if not isinstance(plugins_raw, Mapping):
        issues.append(Issue("plugins", "expected a mapping of plugin name to its settings", prov.get(("plugins",))))
        plugins_raw = {}

    if catalog is None:
        extra = settings.extra_plugins if settings is not None else ()
        skip = {
            name
            for name, value in plugins_raw.items()
            if isinstance(value, Mapping) and _explicitly_disabled(value.get("enabled"))
        }
        catalog, load_issues = discover(extra, skip=skip)
        issues.extend(load_issues)

    sections = _sections(raw, catalog, prov, issues)
    entries = _plugin_entries(plugins_raw, catalog, settings, prov, issues)
    order = _order(entries, catalog, settings, prov, issues)

    if issues or settings is None:
        raise ConfigError(_dedupe(issues))
    return ResolvedConfig(settings=settings, plugins=entries, order=tuple(order), sections=sections, catalog=catalog)


def _explicitly_disabled(value: Any) -> bool:
    return value is False or (isinstance(value, Text) and str(value).strip().lower() in ("false", "no", "off", "0"))


def _sections(
    raw: Mapping[str, Any], catalog: Catalog, prov: Mapping[tuple[str, ...], str], issues: list[Issue]
) -> dict[str, Any]:
    owners: dict[str, str] = {}
    for name, cls in catalog.plugins.items():
        for key in cls.spec.sections:
            if key in owners:
                issues.append(Issue(key, f"claimed by both plugins {owners[key]!r} and {name!r}"))
            owners[key] = name
    known = _settings_keys() | {"plugins"} | set(owners)
    for key in raw:
        if key not in known:
            hint = unknown_key_hint(str(key), raw[key], sorted(known))
            issues.append(Issue(str(key), f"unknown key{hint}", prov.get((str(key),))))
    sections: dict[str, Any] = {}
    for key, owner in owners.items():
        tp = catalog.plugins[owner].spec.sections[key]
        value = _structure_into(tp, raw.get(key), (key,), prov, issues)
        if value is not None:  # None: invalid, and the issue is already recorded
            sections[key] = value
    return sections


def _plugin_entries(
    plugins_raw: Mapping[str, Any],
    catalog: Catalog,
    settings: Settings | None,
    prov: Mapping[tuple[str, ...], str],
    issues: list[Issue],
) -> dict[str, PluginEntry]:
    for name, value in plugins_raw.items():
        if name not in catalog.plugins:
            if isinstance(value, Mapping) and _explicitly_disabled(value.get("enabled")):
                continue  # disabled and not imported: nothing to check
            installed = ", ".join(sorted(catalog.plugins)) or "none"
            issues.append(
                Issue(
                    f"plugins.{name}",
                    f"unknown plugin (installed: {installed})",
                    prov.get(("plugins", str(name))),
                )
            )
        elif not isinstance(value, Mapping | None):
            issues.append(Issue(f"plugins.{name}", "expected a mapping of settings", prov.get(("plugins", str(name)))))
    role = settings.role if settings is not None else None
    entries: dict[str, PluginEntry] = {}
    for name, cls in sorted(catalog.plugins.items()):
        value = plugins_raw.get(name)
        data = dict(value) if isinstance(value, Mapping) else {}
        explicit = _structure_into(bool | None, data.pop("enabled", None), ("plugins", name, "enabled"), prov, issues)
        config = _structure_into(cls.spec.config_type, data, ("plugins", name), prov, issues)
        if explicit is not None:
            enabled, why = bool(explicit), f"plugins.{name}.enabled: {str(explicit).lower()}"
        else:
            enabled = role is not None and role in cls.spec.roles
            why = f"role {role}" if enabled else f"not part of role {role}"
        if config is None:
            config = cls.spec.config_type() if not enabled else None
            if config is None:
                continue
        entries[name] = PluginEntry(
            name=name, cls=cls, config=config, enabled=enabled, why=why, origin=catalog.origins[name]
        )
    return entries


def _order(
    entries: Mapping[str, PluginEntry],
    catalog: Catalog,
    settings: Settings | None,
    prov: Mapping[tuple[str, ...], str],
    issues: list[Issue],
) -> list[str]:
    if settings is not None:
        roles = roles_of(catalog, BUILTIN_ROLES)
        if settings.role not in roles:
            issues.append(
                Issue("role", f"unknown role {settings.role!r} (known: {', '.join(roles)})", prov.get(("role",)))
            )
            return []
    enabled = {name: e.spec for name, e in entries.items() if e.enabled}
    for name, spec in enabled.items():
        for dep in spec.requires:
            if dep not in catalog.plugins:
                issues.append(Issue(f"plugins.{name}", f"requires plugin {dep!r}, which is not installed"))
            elif dep not in enabled:
                issues.append(
                    Issue(
                        f"plugins.{name}",
                        f"requires plugin {dep!r}, which is not enabled (set plugins.{dep}.enabled: true)",
                    )
                )
    order, cycle = start_order(enabled)
    issues.extend(cycle)
    return order


def _dedupe(issues: Iterable[Issue]) -> list[Issue]:
    seen: set[Issue] = set()
    out: list[Issue] = []
    for issue in issues:
        if issue not in seen:
            seen.add(issue)
            out.append(issue)
    return out
