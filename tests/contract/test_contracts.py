"""Cross-plane names live in nvcf_mono/contracts only: no subject, stream or bucket literal elsewhere."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from nvcf_mono.bus.api import BucketSpec, ObjectStoreSpec, StreamSpec
from nvcf_mono.contracts import buckets, env, streams, subjects

PACKAGE = Path(__file__).resolve().parents[2] / "nvcf_mono"
# The bus adapter speaks NATS's own protocol names ($KV.<bucket>, KV_<bucket>), not ours.
EXEMPT = {PACKAGE / "contracts", PACKAGE / "bus"}

SUBJECT = re.compile(r"^(?:(?:Create|Terminate)\.NVCA\b|rq[._]|nvcf\.[a-z_]+(?:\.|$)|\$JS\.)")


def _declared_names() -> set[str]:
    names = {subjects.CREATE_STREAM, subjects.TERMINATE_STREAM}
    for module in (buckets, streams):
        for value in vars(module).values():
            if isinstance(value, BucketSpec | ObjectStoreSpec | StreamSpec):
                names.add(value.name)
    return names


def _literals(path: Path, names: set[str]) -> list[tuple[int, str]]:
    """(line, text) of every string constant that names a cross-plane subject, stream or bucket."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and (node.value in names or SUBJECT.match(node.value))
    ]


def _sources() -> list[Path]:
    return [p for p in PACKAGE.rglob("*.py") if not any(p.is_relative_to(e) for e in EXEMPT)]


def test_no_cross_plane_literal_outside_contracts() -> None:
    names = _declared_names()
    assert "nvcf_functions" in names and "CreateNvcaFunctionTaskStream" in names
    offences = [
        f"{p.relative_to(PACKAGE.parent)}:{line}: {text!r}" for p in _sources() for line, text in _literals(p, names)
    ]
    assert offences == [], "use nvcf_mono.contracts instead of literals:\n" + "\n".join(offences)


@pytest.mark.parametrize(
    "literal",
    [
        '"nvcf_functions"',
        '"Create.NVCA.Function.x.y.z"',
        '"rq.ncp.v.r"',
        '"nvcf.cancel." + fvid',
        '"CreateNvcaFunctionTaskStream"',
    ],
)
def test_the_check_would_catch_a_literal(tmp_path: Path, literal: str) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(f"fvid = 'x'\nSUBJECT = {literal}\n")
    assert _literals(sample, _declared_names()), literal


def test_the_env_contract_names_every_variable_once() -> None:
    names = [v.name for v in env.CONTRACT]
    assert len(names) == len(set(names))
    table = env.markdown()
    assert all(f"`{n}`" in table for n in names)
    readme = (PACKAGE / "contracts" / "README.md").read_text()
    assert table in readme, "contracts/README.md is stale: run `python -m nvcf_mono.contracts.env --write`"
