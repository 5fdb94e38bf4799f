"""What one function version costs the store, at 10, 100 and 2,000 versions (``python -m bench.versions``).

Runs the chaos scenario of ``tests/chaos/many_versions.py`` (an in-process all-in-one platform on
its embedded NATS, a scripted cluster agent): each version created, deployed at min 0, invoked
once, undeployed and deleted. Prints, per size, the bytes, consumers and streams one deployed
version holds, the time to deploy it, and the store before, while loaded and after.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import anyio

from tests.chaos.many_versions import many_versions

SIZES = (10, 100, 2000)


async def run(quick: bool = False) -> None:
    for size in SIZES[:2] if quick else SIZES:
        with tempfile.TemporaryDirectory(prefix="nvcf-bench-versions-") as tmp:
            figures = await many_versions(Path(tmp), size)
            figures.tally.assert_exactly_once()
            figures.line()


if __name__ == "__main__":
    anyio.run(run, "--quick" in sys.argv, backend="asyncio")
