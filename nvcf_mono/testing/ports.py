"""Ports for test servers that are chosen first and bound later (often by a child process, or again after a
restart): taken below the kernel's ephemeral range, so no socket bound to port 0 or connecting out can
take one in between, as it can take a port the kernel handed out a moment ago.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

from nvcf_mono.bus.embedded import free_port

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
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    return free_port(host)
