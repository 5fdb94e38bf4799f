"""Files a request leaves in its output directory that did not go to its caller: the worker says so, once."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

import pytest

from nvcf_mono.worker.agent import Worker
from nvcf_mono.worker.progress import PROGRESS_FILE
from nvcf_mono.worker.scratch import Scratch


def test_outputs_left_behind_are_reported_once_and_packaged_ones_and_a_progress_file_are_not(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="nvcf_mono.worker")
    worker = SimpleNamespace(
        outputs=Scratch(str(tmp_path), keep=1), _packaged={str(tmp_path / "r0")}, _warned_left=False
    )
    worker.outputs.on_left = lambda path: Worker._outputs_left(worker, path)  # type: ignore[arg-type]

    packaged = tmp_path / "r0"  # its files went to the caller as a large response
    packaged.mkdir()
    (packaged / "image.png").write_bytes(b"x")
    worker.outputs.on_left(str(packaged))
    assert caplog.records == [] and worker._packaged == set()

    progress_only = tmp_path / "r1"
    progress_only.mkdir()
    (progress_only / PROGRESS_FILE).write_text("{}")
    worker.outputs.on_left(str(progress_only))
    assert caplog.records == [], "the progress file is the platform's to read, not an output"
    assert not worker._warned_left

    wrote = tmp_path / "r2"
    wrote.mkdir()
    for name in ("image.png", "mask.png"):
        (wrote / name).write_bytes(b"x")
    worker.outputs.on_left(str(wrote))
    [record] = caplog.records
    assert "request r2 left 2 file(s)" in record.message and "image.png, mask.png" in record.message
    assert "did not go to its caller" in record.message
    assert worker._warned_left, "said once per instance"
    worker._packaged.add(str(wrote))  # a later packaged directory is still forgotten when released
    worker.outputs.on_left(str(wrote))
    assert worker._packaged == set() and len(caplog.records) == 1
