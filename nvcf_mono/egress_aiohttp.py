"""aiohttp clients that connect only where :mod:`nvcf_mono.contracts.egress` allows: for what a tenant names
and the platform fetches or sends from its own side (a Helm chart's URL, a telemetry endpoint).

aiohttp asks the resolver only for names, so an IP address in a URL is checked by :func:`url_refusal`
before each request (and each redirect the caller follows); a name is checked by the resolver, whose
answer is the address aiohttp dials.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Sequence

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from yarl import URL

from nvcf_mono.contracts.egress import Network, allowed_of, refusal


class CheckedResolver(AbstractResolver):
    """Names resolved as aiohttp does, keeping only the addresses the platform may connect to for a tenant."""

    def __init__(self, allowed: Sequence[Network]) -> None:
        self._inner = aiohttp.ThreadedResolver()
        self._allowed = allowed

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        found = await self._inner.resolve(host, port, family)
        kept = set(allowed_of(host, (r["host"] for r in found), self._allowed))
        return [r for r in found if r["host"] in kept]

    async def close(self) -> None:
        await self._inner.close()


def checked_session(allowed: Sequence[Network]) -> aiohttp.ClientSession:
    """A client session whose names resolve only to allowed addresses; no proxy from the environment.
    Callers check IP addresses in URLs with :func:`url_refusal` and follow no redirect unchecked.
    """
    connector = aiohttp.TCPConnector(resolver=CheckedResolver(allowed))
    return aiohttp.ClientSession(connector=connector, trust_env=False)


def url_refusal(url: str | URL, allowed: Sequence[Network]) -> str | None:
    """Why the platform does not connect to ``url``'s host when it is an IP address, or None (a name is
    the resolver's to check).
    """
    host = URL(url).host or ""
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return None
    return refusal(host, allowed)
