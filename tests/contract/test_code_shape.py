"""Functions short enough to read at once: none in the package runs past 80 lines (ruff's C90 keeps their
complexity down; this keeps their length)."""

from __future__ import annotations

import ast
from pathlib import Path

import nvcf_mono

LIMIT = 80
#: Generated code is what its generator makes it.
GENERATED = Path(nvcf_mono.__file__).parent / "proto" / "gen"


def test_no_function_is_longer_than_the_limit() -> None:
    root = Path(nvcf_mono.__file__).parent
    long = []
    for path in sorted(root.rglob("*.py")):
        if path.is_relative_to(GENERATED):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno is not None:
                lines = node.end_lineno - node.lineno + 1
                if lines > LIMIT:
                    long.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.name}: {lines} lines")
    assert not long, "split these (one job each):\n" + "\n".join(long)
