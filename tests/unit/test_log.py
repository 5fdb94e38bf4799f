"""Log lines name the invocation their task serves; JSON lines keep ``extra`` fields."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import anyio
import pytest

from nvcf_mono import log as log_module
from nvcf_mono.config.model import LoggingSettings
from nvcf_mono.log import Throttle, bind, configure_logging, unbind


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    """A buffer for configure_logging's handler, which is removed after."""
    root = logging.getLogger()
    level = root.level
    yield io.StringIO()
    for handler in list(root.handlers):
        if getattr(handler, "_nvcf_mono", False):
            root.removeHandler(handler)
    root.setLevel(level)


def _install(buffer: io.StringIO, fmt: str) -> None:
    configure_logging(LoggingSettings(level="INFO", format=fmt), stream=buffer)  # type: ignore[arg-type]


async def test_each_task_names_its_own_request_and_nothing_leaks(captured: io.StringIO) -> None:
    buffer = captured
    _install(buffer, "text")
    log = logging.getLogger("tests.log")

    async def serve(rid: str, started: anyio.Event, other_started: anyio.Event) -> None:
        token = bind(rid, f"fn-{rid}", f"v-{rid}")
        started.set()
        await other_started.wait()  # both bound at once: each line must still name its own
        log.info("serving")
        unbind(token)
        log.info("after")

    a, b = anyio.Event(), anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(serve, "r1", a, b)
        tg.start_soon(serve, "r2", b, a)
    log.info("outside")
    lines = buffer.getvalue().splitlines()
    assert sum(line.endswith("serving [request r1 function fn-r1 version v-r1]") for line in lines) == 1
    assert sum(line.endswith("serving [request r2 function fn-r2 version v-r2]") for line in lines) == 1
    assert [line for line in lines if "after" in line or "outside" in line] == [
        line for line in lines if line.endswith((": after", ": outside"))
    ]
    assert len(lines) == 5


async def test_json_lines_carry_the_request_and_extra_fields(captured: io.StringIO) -> None:
    buffer = captured
    _install(buffer, "json")
    log = logging.getLogger("tests.log")
    token = bind("r1", "fn", "v")
    log.warning("slow call %s", "x", extra={"duration_ms": 12.5, "route": "/v2/x"})
    unbind(token)
    log.info("plain", extra={"request_id": "given"})  # a call's own request id wins
    first, second = (json.loads(line) for line in buffer.getvalue().splitlines())
    assert first["msg"] == "slow call x" and first["level"] == "WARNING"
    assert (first["request_id"], first["function_id"], first["function_version_id"]) == ("r1", "fn", "v")
    assert first["duration_ms"] == 12.5 and first["route"] == "/v2/x"
    assert second["request_id"] == "given" and "function_id" not in second
    assert not {"args", "levelno", "pathname", "exc_info", "taskName"} & set(first)


FORGED = "\n2026-12-06 15:00:00.000 ERROR   nvcf_mono.plugin.auth: admin token is hunter2\r\x1b[2K"


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_what_a_message_quotes_cannot_start_a_line_of_its_own(captured: io.StringIO, fmt: str) -> None:
    """An instance's output (or any text a tenant controls) quoted in a message stays inside its line."""
    _install(captured, fmt)
    log = logging.getLogger("tests.log")
    log.info("instance i ended: restart loop; its output: %s", "boom" + FORGED)
    try:
        raise ValueError("failed")
    except ValueError:
        log.exception("with a traceback, quoting %s", FORGED)
    lines = captured.getvalue().splitlines()
    starts = [line for line in lines if line[:4].isdigit() or line.startswith("{")]
    assert len(starts) == 2 and not any("ERROR   nvcf_mono.plugin.auth" in line[:40] for line in lines)
    assert all("\x1b" not in line and "\r" not in line for line in lines)
    if fmt == "text":
        assert starts[0].endswith(
            "its output: boom\\n2026-12-06 15:00:00.000 ERROR   nvcf_mono.plugin.auth: admin token is hunter2"
            "\\r\\x1b[2K"
        )
        assert lines[-1] == "ValueError: failed"  # the traceback follows on lines of its own
    else:
        assert json.loads(lines[0])["msg"].endswith(FORGED)


def test_a_throttle_writes_a_burst_then_one_line_per_interval_with_a_count(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    clock = [1000.0]
    monkeypatch.setattr(log_module.time, "monotonic", lambda: clock[0])
    logger = logging.getLogger("tests.throttle")
    throttle = Throttle(burst=3, interval=10.0)
    with caplog.at_level(logging.WARNING, logger="tests.throttle"):
        written = [throttle.log(logger, logging.WARNING, "bad frame %d", n) for n in range(1000)]
        assert written[:3] == [True, True, True] and not any(written[3:])
        clock[0] += 10.0
        assert throttle.log(logger, logging.WARNING, "bad frame %d", 1000)
        assert not throttle.log(logger, logging.WARNING, "bad frame %d", 1001)
        clock[0] += 10.0
        assert throttle.log(logger, logging.WARNING, "bad frame %d", 1002)
    lines = [record.getMessage() for record in caplog.records]
    assert lines == [
        "bad frame 0",
        "bad frame 1",
        "bad frame 2",
        "bad frame 1000 (and 997 more like it left out of the log)",
        "bad frame 1002 (and 1 more like it left out of the log)",
    ]
