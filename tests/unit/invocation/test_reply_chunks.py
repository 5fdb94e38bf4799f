"""Response frames become body pieces: queued ones joined into one write, none waited for, gaps refused."""

from __future__ import annotations

import logging
from typing import Any, cast

import anyio
import pytest

from nvcf_mono.contracts.frames import Frame, problem_frame
from nvcf_mono.planes.invocation.answers import ReplyWriter, ResponseBroken
from nvcf_mono.planes.invocation.responses import Pending

pytestmark = pytest.mark.anyio


def _writer() -> ReplyWriter:
    return ReplyWriter(results=cast(Any, None), frame_timeout=1.0, log=logging.getLogger("test"))


def _frame(seq: int, body: bytes, *, end: bool = False, total: int | None = None) -> Frame:
    return Frame(request_id="r", seq=seq, status=200 if seq == 0 else None, body=body, end=end, total_length=total)


async def test_frames_already_queued_go_out_as_one_piece() -> None:
    pending = Pending("r", "v", "cap")
    for seq in (1, 2, 3):
        await pending.put(_frame(seq, b"e%d;" % seq))
    await pending.put(_frame(4, b"", end=True, total=12))
    pieces = [piece async for piece in _writer()._chunks(pending, _frame(0, b"e0;"))]
    assert pieces == [(b"e0;e1;e2;e3;", True)], "one piece, known to be the last: written with the body's end"


async def test_a_piece_goes_out_before_waiting_for_the_next_frame() -> None:
    pending = Pending("r", "v", "cap")
    seen: list[bytes] = []
    async with anyio.create_task_group() as tg:

        async def read() -> None:
            async for piece, last in _writer()._chunks(pending, _frame(0, b"first")):
                seen.append(piece)
                assert last == (piece == b"second")

        tg.start_soon(read)
        await anyio.sleep(0.05)
        assert seen == [b"first"], "nothing else was queued: the first piece did not wait"
        await pending.put(_frame(1, b"second", end=True, total=11))
    assert seen == [b"first", b"second"]


async def test_a_gap_breaks_the_response_even_inside_a_batch() -> None:
    pending = Pending("r", "v", "cap")
    await pending.put(_frame(2, b"skipped one"))
    with pytest.raises(ResponseBroken, match="frame 2"):
        async for _ in _writer()._chunks(pending, _frame(0, b"a")):
            pass


async def test_the_nodes_problem_mid_response_is_the_reason_given_not_a_gap() -> None:
    """The node ends a response whose instance failed with a problem frame of its own (seq 0, attempt 0):
    it was once reported as "frame 0 (attempt 0) where 2 was due", and kept as that for retries."""
    pending = Pending("r", "v", "cap")
    await pending.put(_frame(1, b"b"))
    await pending.put(problem_frame("r", 502, "the instance failed mid-response: InferenceCrashed: Broken"))
    with pytest.raises(ResponseBroken) as broken:
        async for _ in _writer()._chunks(pending, _frame(0, b"a")):
            pass
    assert str(broken.value) == "the response broke off: the instance failed mid-response: InferenceCrashed: Broken"
