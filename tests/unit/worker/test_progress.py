"""Progress files become 202 frames: only this request's, only new reports, clamped, never half-read."""

from __future__ import annotations

import json
import os
from pathlib import Path

import anyio

from nvcf_mono.contracts.frames import Frame
from nvcf_mono.worker.progress import PROGRESS_FILE, ProgressMonitor, ProgressReports


def write(path: Path, doc: object, *, mtime_ns: int) -> None:
    path.write_text(json.dumps(doc))
    os.utime(path, ns=(mtime_ns, mtime_ns))


def test_new_reports_become_frames(tmp_path: Path) -> None:
    path = tmp_path / PROGRESS_FILE
    reports = ProgressReports("req-1", 2, str(path))
    assert reports.read() is None  # no file yet
    write(path, {"id": "req-1", "progress": 40, "partialResponse": {"step": 1}}, mtime_ns=1_000)
    frame = reports.read()
    assert frame is not None
    assert (frame.request_id, frame.seq, frame.attempt, frame.status, frame.percent) == ("req-1", 0, 2, 202, 40)
    assert dict(frame.headers) == {"Content-Type": "application/json"}
    assert json.loads(frame.body) == {"step": 1}
    assert not frame.end and frame.problem is None
    assert reports.read() is None  # nothing new
    reports.sent = 1
    write(path, {"id": "req-1", "progress": 140}, mtime_ns=2_000)
    later = reports.read()
    assert later is not None and (later.seq, later.percent, later.body) == (1, 100, b"{}")


def test_the_same_report_written_again_is_not_sent_twice(tmp_path: Path) -> None:
    path = tmp_path / PROGRESS_FILE
    reports = ProgressReports("req-1", 1, str(path))
    write(path, {"id": "req-1", "progress": 10}, mtime_ns=1_000)
    assert reports.read() is not None
    write(path, {"id": "req-1", "progress": 10}, mtime_ns=2_000)
    assert reports.read() is None


def test_other_requests_and_malformed_reports_are_ignored(tmp_path: Path) -> None:
    path = tmp_path / PROGRESS_FILE
    reports = ProgressReports("req-1", 1, str(path))
    write(path, {"id": "req-2", "progress": 10}, mtime_ns=1_000)
    assert reports.read() is None
    write(path, {"id": "req-1", "progress": "ten"}, mtime_ns=2_000)
    assert reports.read() is None
    write(path, {"id": "req-1", "progress": True}, mtime_ns=3_000)
    assert reports.read() is None
    write(path, ["req-1", 10], mtime_ns=4_000)
    assert reports.read() is None
    path.write_text('{"id": "req-1", "progr')  # caught half written
    os.utime(path, ns=(5_000, 5_000))
    assert reports.read() is None
    path.write_text('{"id": "req-1", "progress": 55.7}')
    os.utime(path, ns=(5_000, 5_000))  # same stamp as the half-written one, but it was never taken
    frame = reports.read()
    assert frame is not None and frame.percent == 55


async def test_the_monitor_sends_reports_until_the_request_closes_them(tmp_path: Path) -> None:
    path = tmp_path / PROGRESS_FILE
    reports = ProgressReports("req-1", 1, str(path))
    monitor = ProgressMonitor(0.01)
    sent: list[Frame] = []

    async def answer(frame: Frame) -> None:
        sent.append(frame)

    monitor.watch(reports, answer)
    async with anyio.create_task_group() as tg:
        tg.start_soon(monitor.run)
        write(path, {"id": "req-1", "progress": 30}, mtime_ns=1_000)
        with anyio.fail_after(5):
            while not sent:
                await anyio.sleep(0.01)
        assert await reports.close() == 1  # the response starts: it is numbered after one report
        monitor.drop("req-1")
        write(path, {"id": "req-1", "progress": 90}, mtime_ns=2_000)
        await reports.poll(answer)  # closed: nothing more, even if asked
        tg.cancel_scope.cancel()
    assert [(f.seq, f.percent) for f in sent] == [(0, 30)]
    assert len(monitor) == 0
