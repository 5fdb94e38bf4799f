"""The TCP sockets a process holds open, read from /proc (Linux): for tests that count connections or ports."""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

LISTEN = "0A"


class TcpSocket(NamedTuple):
    local_port: int
    remote_port: int
    #: The kernel's state code: "01" established, "08" close-wait, "0A" listen, ...
    state: str


def tcp_sockets(pid: int | str = "self") -> list[TcpSocket]:
    """Each TCP socket (IPv4 and IPv6) process ``pid`` has a descriptor for."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target.removeprefix("socket:[").removesuffix("]"))
    found = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[9] in inodes:
                local, remote = (int(address.rsplit(":", 1)[1], 16) for address in fields[1:3])
                found.append(TcpSocket(local, remote, fields[3]))
    return found
