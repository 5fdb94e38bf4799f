"""Where a worker dials the platform: ``NVCF_FQDN_GRPC``, or the file its agent keeps current.

A platform restarted on other ports takes its instances over; their workers were started with the
old address. The local backend writes the current address to ``NVCF_FQDN_GRPC_FILE`` (at start,
at takeover and whenever the control plane names another), and the worker reads it before each
connection, so it follows the platform rather than dialling a port nobody listens on any more.
"""

from __future__ import annotations

import ssl
from typing import Protocol

from grpclib.client import Channel

import nvcf_mono.grpc  # noqa: F401  importing the package installs h2_repr on the worker's side too


def parse(address: str) -> tuple[str, int] | None:
    """``host:port`` -> ``(host, port)``; None when it is not one."""
    host, sep, port = address.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    return host.strip("[]"), int(port)


def current(address: str, address_file: str | None) -> tuple[str, int]:
    """The address to dial now: the file's when it holds one, else ``address`` (checked at start-up)."""
    if address_file:
        try:
            with open(address_file, encoding="utf-8") as fh:
                found = parse(fh.read(256))
        except OSError:
            found = None
        if found is not None:
            return found
    parsed = parse(address)
    assert parsed is not None, f"not host:port: {address!r}"
    return parsed


class Dial(Protocol):
    """How a worker reaches the platform (its config)."""

    @property
    def grpc_address(self) -> str: ...
    @property
    def grpc_address_file(self) -> str | None: ...
    @property
    def grpc_tls(self) -> bool: ...
    @property
    def grpc_ca(self) -> str | None: ...


def channel(dial: Dial) -> Channel:
    """A channel to the platform's current WorkerService address (use it as an async context manager);
    over TLS when the platform's port speaks it, trusting ``grpc_ca`` (else the system's CAs).
    """
    host, port = current(dial.grpc_address, dial.grpc_address_file)
    if not dial.grpc_tls:
        return Channel(host, port)
    context = ssl.create_default_context(cadata=dial.grpc_ca or None)
    context.set_alpn_protocols(["h2"])
    return Channel(host, port, ssl=context)
