"""Requests' directories: empty ones are renamed for the next request, others removed, nothing left at stop."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from nvcf_mono.worker import scratch as scratch_module
from nvcf_mono.worker.dir_events import DirEvents
from nvcf_mono.worker.scratch import Scratch

pytestmark = pytest.mark.anyio
LINUX = sys.platform == "linux"


@pytest.fixture(autouse=True, params=["inotify", "reads"])
def emptiness(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every behaviour holds with inotify's answers and with directory reads alone (no inotify)."""
    if request.param == "reads":
        monkeypatch.setattr(DirEvents, "_open", lambda self: False)
    return str(request.param)


async def _cleared(scratch: Scratch) -> None:
    await anyio.sleep(Scratch.BATCH_DELAY * 3)


async def _until(holds: Callable[[], bool], what: str) -> None:
    """Removals run in batches off the event loop: on a busy machine they take longer than a batch."""
    with anyio.move_on_after(10):
        while not holds():
            await anyio.sleep(Scratch.BATCH_DELAY)
    assert holds(), what


def _names(base: Path) -> set[str]:
    return {p.name for p in base.iterdir()}


def _inode(path: str) -> int | None:
    """The directory's inode; None when it is not a directory."""
    return os.stat(path).st_ino if os.path.isdir(path) else None


def _write(path: Path, text: str) -> None:
    path.write_text(text)


async def test_an_empty_directory_is_reused_and_one_with_files_removed(tmp_path: Path) -> None:
    scratch = Scratch(str(tmp_path), keep=2)
    async with anyio.create_task_group() as tg:
        tg.start_soon(scratch.run)
        first = scratch.make("r1")
        inode = _inode(first)
        assert inode is not None and first == str(tmp_path / "r1")
        scratch.release(first)
        await _cleared(scratch)
        assert _names(tmp_path) == {"r1"}, "kept for the next request"

        second = scratch.make("r2")
        assert _inode(second) == inode, "the spare was renamed, not a new directory made"
        assert _names(tmp_path) == {"r2"}
        _write(Path(second, "large-output.bin"), "x")
        scratch.release(second)
        await _until(lambda: _names(tmp_path) == set(), "a directory with files in it is removed, not kept")
        third = scratch.make("r3")
        assert _names(Path(third)) == set(), "a new, empty directory"
        tg.cancel_scope.cancel()


async def test_a_late_write_into_a_finished_requests_directory_never_reaches_the_next(tmp_path: Path) -> None:
    scratch = Scratch(str(tmp_path), keep=2)
    async with anyio.create_task_group() as tg:
        tg.start_soon(scratch.run)
        first = scratch.make("r1")
        scratch.release(first)
        _write(Path(first, "progress"), '{"id": "r1", "progress": 50}')  # the server, after its answer
        second = scratch.make("r2")
        assert _names(Path(second)) == set()
        await _until(lambda: _names(tmp_path) == {"r2"}, "the directory written into late is removed")
        tg.cancel_scope.cancel()


async def test_a_redelivery_of_a_kept_directorys_request_gets_it_back(tmp_path: Path) -> None:
    scratch = Scratch(str(tmp_path), keep=4)
    async with anyio.create_task_group() as tg:
        tg.start_soon(scratch.run)
        scratch.release(scratch.make("r1"))
        scratch.release(scratch.make("r2"))
        assert scratch.make("r1") == str(tmp_path / "r1"), "its own directory, not another spare"
        # The spare r2 goes to the next request; r1's directory, now in use again, is no spare.
        assert scratch.make("r3") == str(tmp_path / "r3")
        assert scratch.make("r4") == str(tmp_path / "r4")
        assert _names(tmp_path) == {"r1", "r3", "r4"}
        tg.cancel_scope.cancel()


async def test_a_redelivery_keeps_what_an_earlier_attempt_left(tmp_path: Path) -> None:
    scratch = Scratch(str(tmp_path), keep=2)
    async with anyio.create_task_group() as tg:
        tg.start_soon(scratch.run)
        scratch.release(scratch.make("spare-me"))
        await _cleared(scratch)
        (tmp_path / "r1").mkdir()
        _write(tmp_path / "r1" / "progress", "{}")
        assert scratch.make("r1") == str(tmp_path / "r1")
        assert _names(tmp_path / "r1") == {"progress"}
        assert scratch.make("r2") == str(tmp_path / "r2"), "the spare is still there for the next one"
        assert len(_names(tmp_path)) == 2
        tg.cancel_scope.cancel()


async def test_spares_are_bounded_and_nothing_is_left_at_stop(tmp_path: Path) -> None:
    scratch = Scratch(str(tmp_path), keep=2)
    async with anyio.create_task_group() as tg:
        tg.start_soon(scratch.run)
        for path in [scratch.make(f"r{i}") for i in range(5)]:
            scratch.release(path)
        await _until(lambda: len(_names(tmp_path)) == 2, "no more spares than the worker's concurrency")
        scratch.release(scratch.make("last"))
        tg.cancel_scope.cancel()
    assert _names(tmp_path) == set()


async def test_a_base_removed_under_it_is_made_again(tmp_path: Path) -> None:
    base = tmp_path / "responses"
    scratch = Scratch(str(base), keep=1)
    assert _inode(scratch.make("r1")) is not None


async def test_a_recycled_directory_is_not_read_again_while_nothing_is_written_into_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, emptiness: str
) -> None:
    reads: list[str] = []
    real = scratch_module._empty

    def counted(path: str) -> bool:
        reads.append(path)
        return real(path)

    monkeypatch.setattr(scratch_module, "_empty", counted)
    scratch = Scratch(str(tmp_path), keep=2)
    async with anyio.create_task_group() as tg:
        tg.start_soon(scratch.run)
        first = scratch.make("r0")
        for i in range(1, 11):
            path = scratch.make(f"r{i}") if i > 1 else first
            scratch.release(path)
        expected = 0 if emptiness == "inotify" and LINUX else 19  # a new directory is known empty: never read
        assert len(reads) == expected
        # A file written while a request runs is seen, and its directory goes.
        busy = scratch.make("busy")
        _write(Path(busy, "out.bin"), "x")
        scratch.release(busy)
        await _until(lambda: "busy" not in _names(tmp_path), "a directory with a file in it goes")
        tg.cancel_scope.cancel()


async def test_a_file_the_server_wrote_and_removed_leaves_its_directory_reusable(tmp_path: Path) -> None:
    scratch = Scratch(str(tmp_path), keep=2)
    async with anyio.create_task_group() as tg:
        tg.start_soon(scratch.run)
        first = scratch.make("r1")
        inode = _inode(first)
        scratch.release(first)
        second = scratch.make("r2")
        _write(Path(second, "progress"), "{}")
        os.unlink(os.path.join(second, "progress"))
        scratch.release(second)  # read again (something was added), found empty: kept
        assert _inode(scratch.make("r3")) == inode
        tg.cancel_scope.cancel()


@pytest.mark.parametrize("keep", [0, 2])
async def test_whoever_asks_hears_of_a_directory_its_request_left_files_in(tmp_path: Path, keep: int) -> None:
    left: list[str] = []
    scratch = Scratch(str(tmp_path), keep=keep, on_left=left.append)
    async with anyio.create_task_group() as tg:
        tg.start_soon(scratch.run)
        quiet = scratch.make("r1")
        scratch.release(quiet)
        wrote = scratch.make("r2")
        _write(Path(wrote, "out.bin"), "x")
        scratch.release(wrote)
        assert left == [wrote], "told of the directory with a file (before its removal), not of the empty one"
        assert "out.bin" in _names(Path(wrote))
        with anyio.fail_after(10):  # removed in a batch off the event loop: slower on a busy machine
            while "r2" in _names(tmp_path):
                await anyio.sleep(Scratch.BATCH_DELAY)
        tg.cancel_scope.cancel()
