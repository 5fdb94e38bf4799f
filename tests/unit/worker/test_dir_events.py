"""inotify's answers about request directories, against the real kernel."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from nvcf_mono.worker.dir_events import DirEvents

LINUX = sys.platform == "linux"


@pytest.mark.skipif(not LINUX, reason="inotify is Linux's")
def test_lost_events_make_every_directory_unknown(tmp_path: Path) -> None:
    """When the kernel's event queue overflows, no directory is taken as still empty on its word."""
    quiet, noisy = tmp_path / "quiet", tmp_path / "noisy"
    quiet.mkdir()
    noisy.mkdir()
    events = DirEvents()
    try:
        events.track(str(quiet))
        events.track(str(noisy))
        events.found_empty(str(quiet))
        assert events.unchanged(str(quiet))
        limit = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
        for i in range(limit + 2):
            (noisy / str(i)).touch()
        assert not events.unchanged(str(quiet)), "events were lost: quiet is unknown, not empty"
    finally:
        events.close()


@pytest.mark.skipif(not LINUX, reason="inotify is Linux's")
def test_a_watch_follows_its_directory_through_a_rename_and_sees_entries_moved_in(tmp_path: Path) -> None:
    old, new, elsewhere = tmp_path / "r1", tmp_path / "r2", tmp_path / "file"
    old.mkdir()
    elsewhere.write_text("x")
    events = DirEvents()
    try:
        events.track(str(old))
        events.found_empty(str(old))
        old.rename(new)
        events.moved(str(old), str(new))
        assert events.unchanged(str(new))
        assert not events.unchanged(str(old)), "no longer a watched path"
        elsewhere.rename(new / "file")  # moved in, not created
        assert not events.unchanged(str(new))
    finally:
        events.close()


def test_without_inotify_nothing_is_known(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "darwin")
    events = DirEvents()
    events.track(str(tmp_path))
    events.found_empty(str(tmp_path))
    assert not events.unchanged(str(tmp_path))
    events.close()


@pytest.mark.skipif(not LINUX, reason="inotify is Linux's")
@pytest.mark.parametrize("failing", ["fcntl.ioctl", "os.read"])
def test_a_failing_event_queue_turns_inotify_off_instead_of_failing_a_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    events = DirEvents()
    try:
        events.track(str(tmp_path))
        events.found_empty(str(tmp_path))
        if failing == "os.read":
            (tmp_path / "late").write_bytes(b"x")  # an event is queued: it is read

        def broken(*args: object) -> bytes:
            raise OSError(5, "Input/output error")

        monkeypatch.setattr(f"nvcf_mono.worker.dir_events.{failing}", broken)
        assert not events.unchanged(str(tmp_path)), "unknown: the directory is read instead"
        monkeypatch.undo()
        (tmp_path / "late").unlink(missing_ok=True)
        events.track(str(tmp_path))
        events.found_empty(str(tmp_path))
        assert not events.unchanged(str(tmp_path)), "inotify stays off"
    finally:
        events.close()
