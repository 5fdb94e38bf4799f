"""Reading a workload's output from where the last round left off: whole lines, a bounded piece at a time."""

from __future__ import annotations

from pathlib import Path

from nvcf_mono.planes.compute.log_shipping import MAX_READ, read_lines


def test_whole_lines_from_the_offset_and_a_line_being_written_waits(tmp_path: Path) -> None:
    log = tmp_path / "inference.log"
    log.write_bytes(b"one\n\ntwo\nthr")
    lines, offset = read_lines(log, 0)
    assert lines == ["one", "two"] and offset == len(b"one\n\ntwo\n")
    assert read_lines(log, offset) == ([], offset)  # "thr" is not a line yet
    with log.open("ab") as f:
        f.write(b"ee \xff\n")
    assert read_lines(log, offset) == (["three \ufffd"], log.stat().st_size)


def test_a_truncated_file_is_read_from_its_start_and_a_missing_one_is_nothing(tmp_path: Path) -> None:
    log = tmp_path / "inference.log"
    log.write_bytes(b"new\n")
    assert read_lines(log, 100) == (["new"], 4)
    assert read_lines(tmp_path / "gone.log", 7) == ([], 7)


def test_a_line_longer_than_a_read_goes_out_in_pieces(tmp_path: Path) -> None:
    log = tmp_path / "inference.log"
    log.write_bytes(b"x" * (MAX_READ + 10) + b"\n")
    lines, offset = read_lines(log, 0)
    assert lines == ["x" * MAX_READ] and offset == MAX_READ
    assert read_lines(log, offset) == (["x" * 10], MAX_READ + 11)
