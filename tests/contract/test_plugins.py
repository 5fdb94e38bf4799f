"""Every installed plugin honours the contract; planes never import each other."""

from __future__ import annotations

import ast
import inspect
from importlib.metadata import entry_points
from pathlib import Path

import attrs
import pytest

from nvcf_mono.registry import ENTRY_POINT_GROUP, discover, spec_problems

PACKAGE = Path(__file__).resolve().parents[2] / "nvcf_mono"
PLANES = sorted(p.name for p in (PACKAGE / "planes").iterdir() if p.is_dir() and (p / "__init__.py").exists())


def test_the_three_planes_are_registered_as_entry_points() -> None:
    names = {ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)}
    assert {"control", "invocation", "compute"} <= names


@pytest.mark.parametrize(
    "ep", sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name), ids=lambda ep: ep.name
)
def test_entry_point_loads_with_a_valid_spec(ep) -> None:  # type: ignore[no-untyped-def]
    cls = ep.load()
    assert spec_problems(cls, ep.name) == []
    spec = cls.spec
    assert spec.description
    assert attrs.has(spec.config_type)
    spec.config_type()  # every setting has a default: a plugin runs with an empty config section
    assert not inspect.iscoroutinefunction(cls.setup)
    assert inspect.iscoroutinefunction(cls.run)
    for key, tp in spec.sections.items():
        assert key.isidentifier() and tp is not None


def test_discovery_finds_no_broken_plugins() -> None:
    catalog, issues = discover()
    assert issues == []
    assert set(catalog.plugins) >= {"control", "invocation", "compute"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


@pytest.mark.parametrize("plane", PLANES)
def test_a_plane_never_imports_another_plane(plane: str) -> None:
    offenders = []
    for path in sorted((PACKAGE / "planes" / plane).rglob("*.py")):
        for module in _imports(path):
            for other in PLANES:
                if other != plane and (
                    module == f"nvcf_mono.planes.{other}" or module.startswith(f"nvcf_mono.planes.{other}.")
                ):
                    offenders.append(f"{path.relative_to(PACKAGE.parent)} imports {module}")
    assert offenders == []


def test_shared_layers_never_import_planes() -> None:
    shared = [p for p in PACKAGE.rglob("*.py") if "planes" not in p.relative_to(PACKAGE).parts]
    offenders = [
        f"{p.relative_to(PACKAGE.parent)} imports {m}"
        for p in shared
        for m in _imports(p)
        if m.startswith("nvcf_mono.planes")
    ]
    assert offenders == []


def test_the_layering_check_would_catch_a_violation(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("from nvcf_mono.planes.control.plugin import ControlPlane\nimport nvcf_mono.planes.compute\n")
    assert _imports(bad) == {"nvcf_mono.planes.control.plugin", "nvcf_mono.planes.compute"}
