"""A task for tests: reports progress steps, writes result files, then exits as told.

``python -m nvcf_mono.testing.task_program --steps 10,50,100 --results 2 --pause 0.3 --exit 0``
follows the task contract: progress JSON to ``NVCT_PROGRESS_FILE_PATH``, files into
``NVCT_RESULTS_DIR``. ``--sleep S`` just runs that long first (a task that overruns its deadline);
``--ignore-term`` keeps running through SIGTERM (only SIGKILL ends it).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from datetime import UTC, datetime
from pathlib import Path


def progress(path: Path, percent: int, name: str) -> None:
    doc = {
        "percentComplete": percent,
        "lastUpdatedAt": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
        "name": name,
        "metadata": {"step": percent},
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    tmp.replace(path)  # the worker never reads half a file


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", default="")
    parser.add_argument("--results", type=int, default=0)
    parser.add_argument("--pause", type=float, default=0.2)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--exit", type=int, default=0)
    parser.add_argument("--ignore-term", action="store_true")
    parser.add_argument("--secrets-result", action="store_true", help="write the secrets file's names as a result")
    parser.add_argument("--otel-result", action="store_true", help="write its OTEL_* variables as a result")
    parser.add_argument("--big-result", type=int, default=0, help="also write big.bin, of this many bytes")
    parser.add_argument("--big-result-first", action="store_true", help="write big.bin before the first step")
    args = parser.parse_args()
    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    environ = os.environ  # noqa: TID251 - a task reads its contract from its environment
    print(f"task {environ.get('NVCT_TASK_ID')} ({environ.get('NVCT_TASK_NAME')}) starting", flush=True)
    progress_file = Path(environ["NVCT_PROGRESS_FILE_PATH"])
    results = Path(environ["NVCT_RESULTS_DIR"])
    results.mkdir(parents=True, exist_ok=True)
    if args.secrets_result:
        names = sorted(json.loads(Path(environ["SECRETS_FILE"]).read_text()))
        (results / "secret-names.json").write_text(json.dumps(names))
    if args.otel_result:
        otel = {k: v for k, v in environ.items() if k.startswith("OTEL_")}
        (results / "otel.json").write_text(json.dumps(otel))
    time.sleep(args.sleep)
    if args.big_result and args.big_result_first:
        (results / "big.bin").write_bytes(b"x" * args.big_result)
    steps = [int(s) for s in args.steps.split(",") if s]
    for i, step in enumerate(steps):
        if step >= 100:  # results first: 100 completes the task
            for n in range(args.results):
                (results / f"result-{n}.txt").write_text(f"result {n} of {environ.get('NVCT_TASK_ID')}\n")
            if args.big_result and not args.big_result_first:
                (results / "big.bin").write_bytes(b"x" * args.big_result)
        progress(progress_file, step, f"step {i + 1}")
        print(f"progress {step}", flush=True)
        time.sleep(args.pause)
    if args.exit:
        print(f"failing on purpose with exit code {args.exit}", file=sys.stderr, flush=True)
    return int(args.exit)


if __name__ == "__main__":
    sys.exit(main())
