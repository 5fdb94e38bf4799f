"""Ports tests choose before a server binds them: never one the kernel may hand out meanwhile."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from nvcf_mono import ports


def test_a_spare_port_is_free_and_below_the_ephemeral_range() -> None:
    start = ports._ephemeral_start()
    for _ in range(20):
        port = ports.spare_port()
        assert ports._LOWEST <= port < start
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # free: binds


def test_a_port_in_use_is_not_given(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        # Free ones to offer after it: not one fixed port, which a test running beside this one may hold.
        free = [p for p in range(ports._LOWEST, ports._LOWEST + 500) if ports.port_is_free("127.0.0.1", p, reuse=False)]
        chosen = iter([taken, taken, *free[:20]])
        monkeypatch.setattr(ports.random, "randrange", lambda *_: next(chosen, free[-1]))
        monkeypatch.setattr(ports, "_ephemeral_start", lambda: 65_000)
        port = ports.spare_port()
        assert port != taken
        assert port in free[:20]


def test_no_room_below_the_range_falls_back_to_the_kernel(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    low = tmp_path / "range"
    low.write_text("1024\t65000\n")
    monkeypatch.setattr(ports, "_RANGE", low)
    port = ports.spare_port()
    assert port >= 1024
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
