"""An account's uploads under way on a node: what each sees of the others, and nothing kept after."""

from __future__ import annotations

from nvcf_mono.account_uploads import AccountUploads


def test_each_upload_sees_what_the_others_brought_that_no_record_holds_yet() -> None:
    uploads = AccountUploads()
    with uploads.flow("a") as first:
        first.bring(100)
        with uploads.flow("a") as second:
            assert second.others() == 100  # under way when it began
            second.bring(50)
            assert first.others() == 50
            with uploads.flow("b") as theirs:
                theirs.bring(1000)
                assert theirs.others() == 0 and first.others() == 50  # accounts apart
        # second finished: its record holds it for uploads that begin now, first still counts it
        assert first.others() == 50
        with uploads.flow("a") as third:
            assert third.others() == 100  # first's, still under way; second's is in its record
    assert len(uploads) == 0
