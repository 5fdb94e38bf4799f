"""Ports to bind: whether one is free, one the kernel picks, and one no ephemeral port will become.

A port chosen now and bound later (by a child process, or again after a restart) can be taken in
between by any socket bound to port 0 or connecting out: those draw from the kernel's ephemeral
range. :func:`spare_port` chooses below that range.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path


def _socket(host: str) -> socket.socket:
    return socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)


def port_is_free(host: str, port: int, *, reuse: bool = True) -> bool:
    """Whether ``host:port`` can be bound now: with SO_REUSEADDR, as nats-server binds (a port whose
    old connections linger in TIME_WAIT is free), or without it (``reuse=False``: it is not).
    """
    with _socket(host) as sock:
        if reuse:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str) -> int:
    """A port the OS considers free on ``host`` right now."""
    with _socket(host) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


_LOWEST = 20_000
_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _ephemeral_start() -> int:
    try:
        return int(_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default


def spare_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` now that no ephemeral port will become (kernel-chosen when none is left)."""
    top = _ephemeral_start()
    for _ in range(50):
        if top - _LOWEST < 1_000:
            break  # a machine whose ephemeral range starts low: no room below it
        port = random.randrange(_LOWEST, top)
        if port_is_free(host, port, reuse=False):  # whatever binds it next may not set SO_REUSEADDR
            return port
    return free_port(host)
