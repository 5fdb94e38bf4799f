"""The collector settings a serving process takes (in a child interpreter: the test runner keeps its own)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

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


HEAP_PROBE = """
import ctypes, json, sys
from nvcf_mono import heap
if sys.argv[1] == "settled":
    heap.settle()
size = 256 * 1024  # what asyncio asks for on every socket read
buf = bytearray(size)
addr = ctypes.addressof((ctypes.c_char * size).from_buffer(buf))
spans = [line.split()[0].split("-") for line in open("/proc/self/maps") if line.rstrip().endswith("[heap]")]
print(json.dumps(any(int(lo, 16) <= addr < int(hi, 16) for lo, hi in spans)))
"""


def _on_heap(mode: str) -> bool:
    out = subprocess.run(
        [sys.executable, "-c", HEAP_PROBE, mode], capture_output=True, text=True, check=True, timeout=60
    )
    return bool(json.loads(out.stdout))


@pytest.mark.skipif(sys.platform != "linux", reason="the allocator's thresholds are glibc's, on Linux")
def test_a_settled_process_reads_sockets_into_heap_memory_not_a_new_mapping_each_time() -> None:
    try:
        glibc = os.confstr("CS_GNU_LIBC_VERSION")
    except ValueError:
        glibc = None
    if not glibc:
        assert heap._read_buffers_from_the_heap() is False  # nothing to tune, nothing changed
        return
    assert not _on_heap("default"), "glibc maps a 256 KiB block of its own by default"
    assert _on_heap("settled"), "after settle() the read buffer comes from the heap"
