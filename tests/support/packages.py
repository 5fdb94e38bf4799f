"""Install a package of the repository (an example plugin) into a directory of its own, as a user's pip would."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path


def install_package(source: Path, target: Path) -> None:
    """``pip install --no-deps --target`` (with uv when it is there: seconds instead of a minute)."""
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    if uv:
        command = [uv, "pip", "install", "--python", sys.executable, "--no-deps", "--target", str(target), str(source)]
    else:
        command = [sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(target), str(source)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
