"""The one progress line of the waiting commands: live on a terminal, a line per change elsewhere."""

from __future__ import annotations

import io
import re
import time

from nvcf_mono.cli.progress import Progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_pipe_gets_one_line_per_change_with_the_time_waited() -> None:
    out = io.StringIO()
    progress = Progress(out, started=time.monotonic() - 12)
    for line in ("QUEUED", "QUEUED", "RUNNING 40%", "RUNNING 40%", "COMPLETED 100%"):
        progress.show(line)
    progress.close()
    assert out.getvalue() == "[  12s] QUEUED\n[  12s] RUNNING 40%\n[  12s] COMPLETED 100%\n"


def test_a_terminal_gets_one_line_rewritten_in_place_and_ended_once() -> None:
    out = Terminal()
    progress = Progress(out)
    progress.show("DEPLOYING")
    progress.show("DEPLOYING")
    progress.show("ACTIVE")
    progress.close()
    progress.close()  # the except and finally of a waiting command both close it
    assert re.fullmatch(r"(\r\x1b\[K\[\s+0s\] (DEPLOYING|ACTIVE)){3}\n", out.getvalue()), repr(out.getvalue())
    assert out.getvalue().count("ACTIVE") == 1


def test_closing_before_anything_was_shown_writes_nothing() -> None:
    out = Terminal()
    Progress(out).close()
    assert out.getvalue() == ""


def test_a_state_quoting_the_server_stays_one_line_and_inert() -> None:
    for out in (io.StringIO(), Terminal()):
        progress = Progress(out)
        progress.show("FAILED: the server printed\x1b[2J\nboom\r")
        progress.close()
        shown = out.getvalue().replace("\r\x1b[K", "")  # the terminal's own rewrite of the line
        assert "\x1b" not in shown and "\r" not in shown
        assert shown.rstrip("\n").endswith("FAILED: the server printed\\x1b[2J\\nboom\\r")
        assert shown.count("\n") == 1
