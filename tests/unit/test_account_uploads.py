"""An account's uploads under way on a node: what each sees of the others, and nothing kept after."""

from __future__ import annotations

import pytest

from nvcf_mono.account_uploads import AccountUploads


class Refused(Exception):
    def __init__(self, others: int) -> None:
        super().__init__(f"others bring {others}")
        self.others = others


def test_each_upload_sees_what_the_others_brought_that_no_record_holds_yet() -> None:
    uploads = AccountUploads()
    with uploads.flow("a") as first:
        first.reach(100, None, Refused)
        with uploads.flow("a") as second:
            assert second.others() == 100  # under way when it began
            second.reach(50, None, Refused)
            assert first.others() == 50
            with uploads.flow("b") as theirs:
                theirs.reach(1000, None, Refused)
                assert theirs.others() == 0 and first.others() == 50  # accounts apart
        # second finished: its record holds it for uploads that begin now, first still counts it
        assert first.others() == 50
        with uploads.flow("a") as third:
            assert third.others() == 100  # first's, still under way; second's is in its record
    assert len(uploads) == 0


def test_an_upload_is_counted_as_it_reaches_sizes_and_refused_past_the_room_beside_the_others() -> None:
    uploads = AccountUploads()
    with uploads.flow("a") as first, uploads.flow("a") as second:
        first.reach(600, 1000, Refused)  # announced: set aside whole
        first.reach(300, 1000, Refused)  # bytes within what was announced count nothing more
        assert second.others() == 600
        with pytest.raises(Refused) as refused:
            second.reach(500, 1000, Refused)
        assert refused.value.others == 600 and second.mine == 0  # nothing of a refusal is counted
        second.reach(400, 1000, Refused)
        first.reach(700, None, Refused)  # past what it announced: the rest counted as it comes
        assert second.others() == 700
