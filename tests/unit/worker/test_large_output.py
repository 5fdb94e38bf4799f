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
from nvcf_mono.worker.large_output import MAX_DIRECT_RESPONSE, has_outputs, over_direct_limit, package

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


def test_only_a_declared_length_over_the_limit_sends_a_body_behind_a_302() -> None:
    def head(*headers: tuple[str, str]) -> Frame:
        return Frame(request_id="r", seq=0, status=200, headers=headers)

    assert over_direct_limit(head(("Content-Length", str(MAX_DIRECT_RESPONSE + 1))))
    assert over_direct_limit(head(("content-length", f" {MAX_DIRECT_RESPONSE + 1} ")))
    assert not over_direct_limit(head(("Content-Length", str(MAX_DIRECT_RESPONSE))))
    for odd in ("-1", "1e9", "lots", ""):
        assert not over_direct_limit(head(("Content-Length", odd)))
    assert not over_direct_limit(head(("Transfer-Encoding", "chunked")))  # unknown: goes out as it comes
