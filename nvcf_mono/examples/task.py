"""An example task: counts to ``--steps`` in ``--seconds``, reporting progress, and writes a result.

Run by the platform as image ``task-example``. It follows the task contract: progress as JSON
(``percentComplete``, ``lastUpdatedAt``, ``name``, ``metadata``) in ``NVCT_PROGRESS_FILE_PATH``,
result files in ``NVCT_RESULTS_DIR``; exit 0 is success. Self-contained on purpose: copy it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path


def write_progress(path: Path, percent: int, step: int, steps: int) -> None:
    doc = {
        "percentComplete": percent,
        "lastUpdatedAt": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
        "name": f"step {step} of {steps}",
        "metadata": {"step": step, "steps": steps},
    }
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(doc))
    partial.replace(path)  # whole or not at all: the worker reads it any time


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=5, help="how many steps (default 5)")
    parser.add_argument("--seconds", type=float, default=5.0, help="how long in all (default 5)")
    args = parser.parse_args()
    environ = os.environ  # noqa: TID251 - a task reads its contract from its environment
    progress = Path(environ["NVCT_PROGRESS_FILE_PATH"])
    results = Path(environ["NVCT_RESULTS_DIR"])
    results.mkdir(parents=True, exist_ok=True)
    steps = max(args.steps, 1)
    squares = []
    for step in range(1, steps + 1):
        time.sleep(args.seconds / steps)
        squares.append(step * step)
        if step == steps:  # the result goes first: 100 percent completes the task
            (results / "squares.json").write_text(json.dumps({"squares": squares}))
        write_progress(progress, step * 100 // steps, step, steps)
        print(f"step {step}/{steps}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
