"""A response whose request left files in its output directory, or whose body is over the direct limit:
zipped, uploaded, answered with a 302.

NVCF's worker contract: a function writes large outputs into ``NVCF-LARGE-OUTPUT-DIR`` and answers, or
answers a body larger than ``NVCF-MAX-RESPONSE-SIZE-BYTES``; the caller gets ``302`` with a
``Location`` to download a zip of the response body (as ``<requestId>.response``) and those files.

Only regular files are taken: a link (to a file or a directory) is skipped, never followed, a file
is opened with ``O_NOFOLLOW``, and a file with other names (hard links) is skipped too, so a function
cannot make the worker package what the worker may read and the function may not. A file the worker
cannot read (written without group read permission) is skipped and logged. The zip stores entries
uncompressed (outputs are usually compressed already) and is built on disk, off the event loop.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import tempfile
import zipfile
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from typing import IO

import anyio
import anyio.to_thread
import attrs

from nvcf_mono.contracts.frames import Frame, header_value

log = logging.getLogger("nvcf_mono.worker")

#: Bytes per upload message.
CHUNK = 1 << 20
#: NVCF's ``maxDirectResponseSizeBytes``: a successful body above it (in compatibility mode) is zipped.
MAX_DIRECT_RESPONSE = 5 * 1024 * 1024


def over_direct_limit(first: Frame) -> bool:
    """The response declares a body larger than :data:`MAX_DIRECT_RESPONSE`, or (its length unknown) the
    body :func:`gather` read already is.
    """
    declared = header_value(first.headers, "content-length")
    if declared is not None and declared.strip().isdigit():
        return int(declared) > MAX_DIRECT_RESPONSE
    return len(first.body) > MAX_DIRECT_RESPONSE


def unsized(first: Frame) -> bool:
    """A body of unknown length (chunked) still to come, other than an event stream: NVCF's compatibility
    mode reads such a body before answering, to know its size. An event stream goes out as it comes
    (a caller that sends no ``Accept: text/event-stream`` still gets its events as they are written).
    """
    if first.end or header_value(first.headers, "content-length") is not None:
        return False
    content_type = header_value(first.headers, "content-type") or ""
    return not content_type.lower().startswith("text/event-stream")


async def gather(first: Frame, rest: AsyncIterator[Frame]) -> Frame:
    """The response's head with its body read from ``rest`` to its end, or only until it passed
    :data:`MAX_DIRECT_RESPONSE` (the frame does not end then: the rest stays in ``rest``).
    """
    parts, size, last = [first.body], len(first.body), first
    while not last.end and size <= MAX_DIRECT_RESPONSE:
        try:
            last = await anext(rest)
        except StopAsyncIteration:
            break
        parts.append(last.body)
        size += len(last.body)
    if len(parts) == 1:
        return first
    return attrs.evolve(first, body=b"".join(parts), end=last.end, total_length=size if last.end else None)


def has_outputs(path: str, *, besides: frozenset[str]) -> bool:
    """The directory holds an entry other than ``besides`` (False when it cannot be read)."""
    try:
        with os.scandir(path) as entries:
            return any(e.name not in besides for e in entries)
    except OSError:
        return False


async def package(
    first: Frame,
    rest: AsyncIterable[Frame],
    *,
    output_dir: str,
    besides: frozenset[str],
    scratch: str,
    upload: Callable[[IO[bytes]], Awaitable[str]],
) -> Frame:
    """The 302 frame answering a response whose outputs were zipped and uploaded (``upload`` returns
    the download link). The response's own frames are read to its end first.
    """
    with tempfile.TemporaryFile(dir=scratch) as body, tempfile.TemporaryFile(dir=scratch) as archive:
        await anyio.to_thread.run_sync(body.write, first.body)
        if not first.end:
            async for frame in rest:
                if frame.body:
                    await anyio.to_thread.run_sync(body.write, frame.body)
                if frame.end:
                    break
        await anyio.to_thread.run_sync(_zip, body, archive, f"{first.request_id}.response", output_dir, besides)
        location = await upload(archive)
    return Frame(
        request_id=first.request_id,
        seq=first.seq,
        attempt=first.attempt,
        status=302,
        headers=(("Location", location), ("Content-Length", "0")),
        body=b"",
        end=True,
        total_length=0,
        timing=first.timing,
    )


def _zip(body: IO[bytes], archive: IO[bytes], body_name: str, output_dir: str, besides: frozenset[str]) -> None:
    body.seek(0)
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
        with zf.open(body_name, "w", force_zip64=True) as entry:
            shutil.copyfileobj(body, entry, CHUNK)
        for root, _dirs, files in os.walk(output_dir, followlinks=False):
            for name in sorted(files):
                path = os.path.join(root, name)
                relative = os.path.relpath(path, output_dir)
                if relative in besides:
                    continue
                _add(zf, path, relative)
    archive.seek(0)


def _add(zf: zipfile.ZipFile, path: str, arcname: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        log.warning("not packaging %s: %s (outputs must be regular files the group may read)", arcname, err)
        return
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            log.warning("not packaging %s: not a regular file", arcname)
            return
        if st.st_nlink > 1:  # a hard link may name a file of the worker's own: never packaged
            log.warning("not packaging %s: a file with other names (hard links)", arcname)
            return
        with zf.open(arcname, "w", force_zip64=True) as entry:
            shutil.copyfileobj(f, entry, CHUNK)
