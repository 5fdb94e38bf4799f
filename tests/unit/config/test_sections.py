"""Top-level sections owned by a plugin (as the compute plugin owns the ``images:`` catalog)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nvcf_mono.config.load import ConfigError, ConfigSources, load_config
from nvcf_mono.config.reference import render_reference
from nvcf_mono.host import Host
from tests.support import plugins
from tests.support.plugins import Image

EXTRA = ("extra_plugins", "[tests.support.plugins:Catalogued]", "test")


def _load(*files: Path, extra: tuple[tuple[str, str, str], ...] = ()):  # type: ignore[no-untyped-def]
    return load_config(ConfigSources(files=files, overrides=(EXTRA, *extra)))


def test_a_second_file_adds_entries_to_a_plugin_section(tmp_path: Path) -> None:
    base = tmp_path / "base.yaml"
    base.write_text("test_images:\n  echo: {command: [python, -m, echo], port: 9000}\n")
    mine = tmp_path / "mine.yaml"
    mine.write_text("test_images:\n  llm: {command: [vllm, serve]}\n  echo: {port: 9001}\n")
    config = _load(base, mine)
    assert config.sections["test_images"] == {
        "echo": Image(command=("python", "-m", "echo"), port=9001),
        "llm": Image(command=("vllm", "serve"), port=8000),
    }
    plugins.EVENTS.clear()
    Host(
        load_config(
            ConfigSources(files=(base, mine), overrides=(EXTRA, ("plugins.catalogued.enabled", "true", "test")))
        )
    )
    assert plugins.EVENTS == ["catalogued:test_images:['echo', 'llm']"]


def test_section_entries_are_validated_with_their_path(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("test_images:\n  echo: {port: high, cmd: x}\n")
    with pytest.raises(ConfigError) as err:
        _load(bad)
    assert [str(i) for i in err.value.issues] == [
        f"test_images.echo.port: expected an integer, got str 'high' (from {bad})",
        f"test_images.echo.cmd: unknown key (did you mean 'command'?) (from {bad})",
    ]


def test_without_the_owning_plugin_the_section_is_unknown(tmp_path: Path) -> None:
    path = tmp_path / "images.yaml"
    path.write_text("test_images: {}\n")
    with pytest.raises(ConfigError, match="test_images: unknown key"):
        load_config(ConfigSources(files=(path,)))


def test_the_reference_documents_owned_sections() -> None:
    text = render_reference(_load().catalog)
    assert (
        "# Owned by the catalogued plugin.\ntest_images: {}\n# Each entry maps a name to Image: How to run one" in text
    )
    assert "#   <name>:\n#     # Command line of the image's server.\n#     command: []\n" in text
