"""Thousands of versions on the embedded defaults: the store holds what is queued, not what was deployed.

Each version's queue used to reserve 1 GiB of the 10 GiB store and keep it after its deployment
went, so the 11th version could not be invoked. The scenario (``tests/chaos/many_versions.py``)
creates, deploys at min 0, invokes, undeploys and deletes versions; here every caller must have
been answered exactly once and the store's reserved bytes, streams and consumers be back where they
started (``NVCF_CHAOS_SCALE=10`` runs 2,000 versions; ``bench/versions.py`` prints the costs).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos.many_versions import many_versions
from tests.chaos.tally import SCALE, scaled

pytestmark = [pytest.mark.slow, pytest.mark.chaos, pytest.mark.timeout(120 + 60 * SCALE)]


async def test_versions_cost_what_is_queued_and_leave_nothing_behind(tmp_path: Path) -> None:
    figures = await many_versions(tmp_path, scaled(200))
    figures.line()
    figures.tally.assert_exactly_once()
    before, loaded, after = figures.baseline, figures.loaded, figures.after
    # No reservation per version: what is reserved does not grow with the versions deployed.
    assert loaded.reserved_storage == before.reserved_storage
    assert loaded.streams - before.streams == figures.versions  # one queue each while deployed
    assert (after.reserved_storage, after.streams, after.consumers) == (
        before.reserved_storage,
        before.streams,
        before.consumers,
    )
