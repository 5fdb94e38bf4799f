"""The Makefile's recipes are valid shell: what ``make up`` runs on a fresh machine is not exercised by
``make test`` (which installs through another rule), so a recipe that breaks only there shows here.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_recipe_from_a_fresh_checkout_is_valid_shell(tmp_path: Path) -> None:
    # --always-make: every rule's recipe, as on a machine without the virtualenv; -n: printed, not run.
    printed = subprocess.run(
        ["make", "-n", "--always-make", f"VENV={tmp_path / 'venv'}", "up", "up-split", "test", "bench", "reference"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert "install" in printed and "nvcf-mono up" in printed
    script = tmp_path / "recipes.sh"
    script.write_text(printed)
    checked = subprocess.run(["sh", "-n", str(script)], capture_output=True, text=True, timeout=30)
    assert checked.returncode == 0, checked.stderr
    # The extras each rule installs arrive whole (a comma in $(call ...) would split them).
    assert "'.[helm,otel]'" in printed and "'.[test]'" in printed and "'.[test,bench]'" in printed
