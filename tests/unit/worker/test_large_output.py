"""Packaging a large response: the body and the request's regular files, never what a link points at."""

from __future__ import annotations

import io
import os
import zipfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import IO

import pytest

from nvcf_mono.contracts.frames import Frame
from nvcf_mono.worker.large_output import (
    MAX_DIRECT_RESPONSE,
    gather,
    has_outputs,
    over_direct_limit,
    package,
    unsized,
)

pytestmark = pytest.mark.anyio


def frame(seq: int, body: bytes, *, end: bool) -> Frame:
    return Frame(request_id="req-1", seq=seq, attempt=1, status=200 if seq == 0 else None, body=body, end=end)


async def test_the_body_and_regular_files_are_zipped_links_and_specials_are_not(tmp_path: Path) -> None:
    out, scratch, secret = tmp_path / "out", tmp_path / "scratch", tmp_path / "secret"
    for d in (out, scratch, secret):
        d.mkdir()
    (secret / "key").write_text("the worker's own")
    (out / "image.png").write_bytes(b"PNG")
    (out / "nested" / "deeper").mkdir(parents=True)
    (out / "nested" / "deeper" / "mask.txt").write_text("mask")
    (out / "progress").write_text("{}")
    os.symlink(secret / "key", out / "file-link")
    os.symlink(secret, out / "dir-link")
    os.mkfifo(out / "fifo")  # opening it blocks without O_NONBLOCK; it is skipped
    os.link(secret / "key", out / "hard-link")  # another name of a file the function did not make
    assert has_outputs(str(out), besides=frozenset({"progress"}))

    async def rest() -> AsyncIterator[Frame]:
        yield frame(1, b" body", end=False)
        yield frame(2, b"", end=True)

    uploaded: list[bytes] = []

    async def upload(archive: IO[bytes]) -> str:
        uploaded.append(archive.read())
        return "https://example/large/req-1"

    answer = await package(
        frame(0, b"the", end=False),
        rest(),
        output_dir=str(out),
        besides=frozenset({"progress"}),
        scratch=str(scratch),
        upload=upload,
    )
    assert (answer.status, answer.body, answer.end, answer.total_length) == (302, b"", True, 0)
    assert dict(answer.headers) == {"Location": "https://example/large/req-1", "Content-Length": "0"}
    [data] = uploaded
    archive = zipfile.ZipFile(io.BytesIO(data))
    assert sorted(archive.namelist()) == ["image.png", "nested/deeper/mask.txt", "req-1.response"]
    assert archive.read("req-1.response") == b"the body" and archive.read("nested/deeper/mask.txt") == b"mask"
    assert os.listdir(scratch) == [], "the temporary files are gone"


def test_an_output_directory_with_only_a_progress_file_or_none_at_all_has_no_outputs(tmp_path: Path) -> None:
    assert not has_outputs(str(tmp_path / "missing"), besides=frozenset())
    (tmp_path / "progress").write_text("{}")
    assert not has_outputs(str(tmp_path), besides=frozenset({"progress"}))
    assert has_outputs(str(tmp_path), besides=frozenset())


def test_a_declared_length_or_a_body_read_over_the_limit_sends_it_behind_a_302() -> None:
    def head(*headers: tuple[str, str], body: bytes = b"") -> Frame:
        return Frame(request_id="r", seq=0, status=200, headers=headers, body=body)

    assert over_direct_limit(head(("Content-Length", str(MAX_DIRECT_RESPONSE + 1))))
    assert over_direct_limit(head(("content-length", f" {MAX_DIRECT_RESPONSE + 1} ")))
    assert not over_direct_limit(head(("Content-Length", str(MAX_DIRECT_RESPONSE))))
    for odd in ("-1", "1e9", "lots", ""):
        assert not over_direct_limit(head(("Content-Length", odd)))
    # Unknown length: what was read of it decides.
    assert not over_direct_limit(head(("Transfer-Encoding", "chunked"), body=b"x" * MAX_DIRECT_RESPONSE))
    assert over_direct_limit(head(body=b"x" * (MAX_DIRECT_RESPONSE + 1)))


def test_only_a_body_of_unknown_length_still_to_come_is_read_first_and_never_an_event_stream() -> None:
    def head(*headers: tuple[str, str], end: bool = False) -> Frame:
        return Frame(request_id="r", seq=0, status=200, headers=headers, end=end)

    assert unsized(head(("Content-Type", "application/x-ndjson")))
    assert unsized(head())
    assert not unsized(head(end=True))  # already whole
    assert not unsized(head(("Content-Length", "12")))
    assert not unsized(head(("content-type", "Text/Event-Stream; charset=utf-8")))


async def test_gathering_reads_to_the_end_or_just_past_the_limit_and_leaves_the_rest() -> None:
    piece = b"p" * (1 << 20)

    async def pieces(n: int) -> AsyncIterator[Frame]:
        for i in range(1, n + 1):
            yield frame(i, piece, end=i == n)

    whole = await gather(frame(0, b"h", end=False), pieces(3))
    assert whole.end and whole.body == b"h" + piece * 3 and whole.total_length == len(whole.body)
    assert whole.seq == 0 and whole.status == 200

    rest = pieces(8)
    partial = await gather(frame(0, b"h", end=False), rest)
    assert not partial.end and partial.total_length is None
    assert len(partial.body) == 1 + 5 * len(piece) > MAX_DIRECT_RESPONSE  # stopped at the first piece past it
    assert [f.seq async for f in rest] == [6, 7, 8]  # still there, for the zip

    ended = frame(0, b"all", end=True)
    assert await gather(ended, pieces(2)) is ended
