"""The collector settings a serving process takes (in a child interpreter: the test runner keeps its own)."""

from __future__ import annotations

import json
import subprocess
import sys

from nvcf_mono import heap

PROBE = """
import gc, json
from nvcf_mono import heap
before = gc.get_threshold()
heap.settle()
print(json.dumps({"before": before, "after": gc.get_threshold(), "frozen": gc.get_freeze_count()}))
"""


def test_settling_freezes_start_up_and_collects_the_young_less_often() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=60)
    doc = json.loads(out.stdout)
    assert doc["after"] == [heap.YOUNG_THRESHOLD, *doc["before"][1:]]
    assert doc["after"][0] > doc["before"][0]
    assert doc["frozen"] > 1000, "the modules and objects start-up made are out of the collector's view"
