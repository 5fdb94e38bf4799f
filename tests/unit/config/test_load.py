"""Config resolution: layering, precedence, roles, plugin sections, and the error lines users see."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from nvcf_mono.config.load import ConfigError, ConfigSources, load_config
from nvcf_mono.config.model import Settings
from nvcf_mono.registry import discover

ROOT = Path(__file__).resolve().parents[3]


def _load(*files: Path, env: dict[str, str] | None = None, sets: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    overrides = tuple((k, v, f"--set {k}") for k, v in (sets or {}).items())
    return load_config(ConfigSources(files=files, environ=env or {}, overrides=overrides))


def _errors(*files: Path, env: dict[str, str] | None = None, sets: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as err:
        _load(*files, env=env, sets=sets)
    return [str(issue) for issue in err.value.issues]


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


PLANES = ("compute", "control", "invocation")


def _planes(order: tuple[str, ...]) -> tuple[str, ...]:
    """The planes among the enabled plugins, by name (auth and other plugins come and go)."""
    return tuple(sorted(name for name in order if name in PLANES))


def test_no_config_is_the_all_in_one_default() -> None:
    config = _load()
    assert config.settings == Settings()
    assert _planes(config.order) == ("compute", "control", "invocation")
    assert {"auth", "auth_api_key", "auth_static_token", "openapi"} <= set(config.order)
    assert all(entry.why == "role all-in-one" for entry in config.enabled)


def test_the_shipped_all_in_one_file_is_the_default_written_out() -> None:
    assert _load(ROOT / "config" / "all-in-one.yaml").settings == Settings()


def test_the_reference_file_loads_and_is_the_default() -> None:
    config = _load(ROOT / "config" / "reference.yaml")
    assert config.settings == Settings()
    assert config.order == _load().order


@pytest.mark.parametrize("role", ["control", "invocation", "compute"])
def test_role_files_enable_their_plane_only(role: str) -> None:
    config = _load(ROOT / "config" / f"{role}.yaml")
    assert _planes(config.order) == (role,)
    assert config.settings.bus.url == "nats://127.0.0.1:4222"


def test_files_merge_deeply_and_later_layers_win(tmp_path: Path) -> None:
    base = _write(tmp_path, "base.yaml", "version: 1\nhttp: {host: 0.0.0.0, port: 9000}\nnode: {region: eu}\n")
    mine = _write(tmp_path, "mine.yaml", "http: {port: 9100}\n")
    config = _load(base, mine)
    assert (config.settings.http.host, config.settings.http.port, config.settings.node.region) == (
        "0.0.0.0",
        9100,
        "eu",
    )
    config = _load(base, mine, env={"NVCF_MONO__HTTP__PORT": "9200", "NVCF_MONO__NODE__REGION": "us", "UNRELATED": "x"})
    assert (config.settings.http.port, config.settings.node.region) == (9200, "us")
    config = _load(base, mine, env={"NVCF_MONO__HTTP__PORT": "9200"}, sets={"http.port": "9300"})
    assert config.settings.http.port == 9300


def test_per_plugin_enabled_overrides_the_role() -> None:
    config = _load(sets={"role": "control", "plugins.compute.enabled": "true"})
    assert _planes(config.order) == ("compute", "control")
    assert config.plugins["compute"].why == "plugins.compute.enabled: true"
    config = _load(sets={"plugins.invocation.enabled": "false"})
    assert _planes(config.order) == ("compute", "control")
    config = _load(sets={"role": "custom", "plugins.control.enabled": "yes", "plugins.auth.enabled": "yes"})
    assert config.order == ("auth", "control")


def test_unknown_key_names_the_file_and_suggests(tmp_path: Path) -> None:
    path = _write(tmp_path, "bad.yaml", "htp:\n  port: 1\nhttp:\n  prot: 2\n")
    assert _errors(path) == [
        f"http.prot: unknown key (did you mean 'port'?) (from {path})",
        f"htp: unknown key (did you mean 'http'?) (from {path})",
    ]


def test_wrong_type_from_the_environment_names_the_variable() -> None:
    assert _errors(env={"NVCF_MONO__HTTP__PORT": "eighty"}) == [
        "http.port: expected an integer, got 'eighty' (from env NVCF_MONO__HTTP__PORT)"
    ]


def test_unknown_role_lists_the_known_ones() -> None:
    assert _errors(sets={"role": "everything"}) == [
        "role: unknown role 'everything' (known: all-in-one, compute, control, custom, invocation) (from --set role)"
    ]


def test_unknown_plugin_lists_the_installed_ones() -> None:
    installed = ", ".join(sorted(discover()[0].plugins))
    assert "control" in installed
    assert _errors(sets={"plugins.autoscalr.enabled": "true"}) == [
        f"plugins.autoscalr: unknown plugin (installed: {installed}) (from --set plugins.autoscalr.enabled)"
    ]


def test_an_unknown_plugin_that_is_disabled_is_ignored() -> None:
    assert _load(sets={"plugins.gone.enabled": "false"}).order == _load().order


def test_a_plugin_requiring_a_disabled_plugin_is_an_error() -> None:
    errors = _errors(
        sets={"role": "custom", "extra_plugins": "[tests.support.plugins:After]", "plugins.after.enabled": "true"}
    )
    assert errors == ["plugins.after: requires plugin 'recorder', which is not installed"]
    errors = _errors(
        sets={
            "role": "custom",
            "plugins.after.enabled": "true",
            "extra_plugins": "[tests.support.plugins:After, tests.support.plugins:Recorder]",
        }
    )
    assert errors == [
        "plugins.after: requires plugin 'recorder', which is not enabled (set plugins.recorder.enabled: true)"
    ]


def test_plugin_settings_are_typed_by_the_plugin() -> None:
    sets = {"extra_plugins": "[tests.support.plugins:Flaky]", "plugins.flaky.enabled": "true"}
    assert _load(sets={**sets, "plugins.flaky.failures": "7"}).plugins["flaky"].config.failures == 7
    assert _errors(sets={**sets, "plugins.flaky.failures": "many"}) == [
        "plugins.flaky.failures: expected an integer, got 'many' (from --set plugins.flaky.failures)"
    ]
    assert _errors(sets={**sets, "plugins.flaky.retries": "1"}) == [
        "plugins.flaky.retries: unknown key (known keys: failures) (from --set plugins.flaky.retries)"
    ]


def test_a_plugin_that_cannot_be_imported_is_reported() -> None:
    errors = _errors(sets={"extra_plugins": "[no_such_module:Plugin]"})
    assert errors == [
        "extra_plugins: cannot load extra_plugins 'no_such_module:Plugin': ModuleNotFoundError: "
        "No module named 'no_such_module'"
    ]


def test_file_problems_are_one_line_each(tmp_path: Path) -> None:
    missing = tmp_path / "missing.yaml"
    assert _errors(missing) == [f"<top level>: cannot read config file {missing}: No such file or directory"]
    broken = _write(tmp_path, "broken.yaml", "http:\n  port: [1\n")
    (line,) = _errors(broken)
    assert line.startswith(f"<top level>: {broken} at line 3, column 1: invalid YAML")
    listy = _write(tmp_path, "list.yaml", "- a\n- b\n")
    assert _errors(listy) == [f"<top level>: {listy}: the top level must be a mapping of keys, got list"]
    future = _write(tmp_path, "future.yaml", "version: 2\n")
    assert _errors(future) == [f"version: {future} has schema version 2; this nvcf-mono reads version 1"]


def test_malformed_env_and_set_keys() -> None:
    assert _errors(env={"NVCF_MONO__HTTP____PORT": "1"}) == [
        "<top level>: environment variable NVCF_MONO__HTTP____PORT is not NVCF_MONO__SECTION__KEY"
    ]
    assert _errors(sets={"http..port": "1"}) == [
        "<top level>: --set http..port: 'http..port' is not a dotted config key"
    ]


def test_resolved_data_is_a_valid_config_again(tmp_path: Path) -> None:
    config = _load(sets={"http.port": "9000", "role": "control"})
    path = _write(tmp_path, "resolved.yaml", yaml.safe_dump(config.to_data()))
    again = _load(path)
    assert again.settings == config.settings
    assert again.order == config.order


def test_checks_inside_sections() -> None:
    errors = _errors(sets={"bus.tls.cert_file": "/c.pem", "http.port": "70000", "bus.url": "http://x"})
    assert errors == [
        "bus.tls.key_file: cert_file and key_file must be given together (from --set bus.tls.cert_file)",
        "bus.url: must be nats://host:port URLs separated by commas, got 'http://x' (from --set bus.url)",
        "http.port: must be between 0 and 65535, got 70000 (from --set http.port)",
    ]
