"""Reading a workload's output from where the last round left off: whole lines, a bounded piece at a time."""

from __future__ import annotations

from pathlib import Path

import anyio
import anyio.lowlevel

from nvcf_mono.planes.compute.log_shipping import MAX_READ, QUEUED_BYTES, Put, _StreamLines, encode, read_lines


def test_whole_lines_from_the_offset_and_a_line_being_written_waits(tmp_path: Path) -> None:
    log = tmp_path / "inference.log"
    log.write_bytes(b"one\n\ntwo\nthr")
    lines, offset = read_lines(log, 0)
    assert lines == ["one", "two"] and offset == len(b"one\n\ntwo\n")
    assert read_lines(log, offset) == ([], offset)  # "thr" is not a line yet
    with log.open("ab") as f:
        f.write(b"ee \xff\n")
    assert read_lines(log, offset) == (["three \ufffd"], log.stat().st_size)


def test_a_truncated_file_is_read_from_its_start_and_a_missing_one_is_nothing(tmp_path: Path) -> None:
    log = tmp_path / "inference.log"
    log.write_bytes(b"new\n")
    assert read_lines(log, 100) == (["new"], 4)
    assert read_lines(tmp_path / "gone.log", 7) == ([], 7)


def test_a_line_longer_than_a_read_goes_out_in_pieces(tmp_path: Path) -> None:
    log = tmp_path / "inference.log"
    log.write_bytes(b"x" * (MAX_READ + 10) + b"\n")
    lines, offset = read_lines(log, 0)
    assert lines == ["x" * MAX_READ] and offset == MAX_READ
    assert read_lines(log, offset) == (["x" * 10], MAX_READ + 11)


async def test_a_followed_log_holds_a_bounded_number_of_bytes_however_long_its_lines() -> None:
    line = "x" * (64 * 1024)
    made = 0

    async def lines(put: Put) -> None:
        nonlocal made
        for _ in range(200):  # a workload that writes long lines faster than its endpoint takes them
            made += 1
            await put(line, ())
            await anyio.lowlevel.checkpoint()

    source = _StreamLines(lines)
    async with anyio.create_task_group() as tg:
        tg.start_soon(source.run)
        await anyio.sleep(0.2)
        held = made
        assert held * len(line) <= QUEUED_BYTES + 2 * len(line), "the reader waits once the queue is full"
        taken = await source.take()
        assert 0 < sum(len(text) for text, _ in taken) <= MAX_READ
        await anyio.sleep(0.2)
        assert made > held  # room again: it reads on
        assert (made - len(taken)) * len(line) <= QUEUED_BYTES + 2 * len(line)
        tg.cancel_scope.cancel()


def test_lines_of_several_origins_go_out_as_one_resource_each_in_their_order() -> None:
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

    web = (("k8s.pod.name", "web-1"), ("k8s.container.name", "server"))
    cache = (("k8s.pod.name", "cache-0"), ("k8s.container.name", "redis"))
    lines = [("a", web), ("b", cache), ("c", web)]
    request = ExportLogsServiceRequest.FromString(encode(lines, {"service.name": "chart"}))
    got = [
        (
            {kv.key: kv.value.string_value for kv in resource_logs.resource.attributes},
            [r.body.string_value for r in resource_logs.scope_logs[0].log_records],
        )
        for resource_logs in request.resource_logs
    ]
    assert got == [
        ({"service.name": "chart", "k8s.pod.name": "web-1", "k8s.container.name": "server"}, ["a", "c"]),
        ({"service.name": "chart", "k8s.pod.name": "cache-0", "k8s.container.name": "redis"}, ["b"]),
    ]
    (plain,) = ExportLogsServiceRequest.FromString(encode([("x", ())], {"service.name": "fn"})).resource_logs
    assert [kv.key for kv in plain.resource.attributes] == ["service.name"]
