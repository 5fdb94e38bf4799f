"""Where the platform connects on a tenant's behalf (its telemetry endpoints, its Helm charts): public
addresses, and the non-public networks its operator lists.

A tenant names the address, but the connection leaves from the platform's side (the worker, the
cluster agent, the control plane): without a rule a tenant could make the host reach its own loopback
services, the cluster's private network or a cloud's instance metadata service. What registers an
address checks it then; whatever connects checks each address again as it dials, after resolving the
name itself, so a name that later resolves elsewhere gains nothing.
"""

from __future__ import annotations

import errno
import ipaddress
import re
import socket
from collections.abc import Iterable, Sequence

import anyio
from yarl import URL

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address

#: The well-known NAT64 prefix: its addresses reach the IPv4 address in their last 32 bits.
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


class EgressRefused(OSError):
    """No address of the endpoint is one the platform connects to for a tenant."""

    def __init__(self, reason: str) -> None:
        super().__init__(errno.EACCES, reason)  # the reason is the strerror clients report


def networks_problem(values: Iterable[object]) -> str | None:
    """Why ``values`` is not a list of networks in CIDR notation, or None."""
    for value in values:
        try:
            ipaddress.ip_network(str(value), strict=False)
        except ValueError as err:
            return f"{value!r} is not a network in CIDR notation (e.g. 10.0.0.0/8): {err}"
    return None


#: A host name or address in brackets, and a port perhaps, as image names give a registry.
_SERVER = re.compile(r"([a-z0-9]([a-z0-9.-]*[a-z0-9])?|\[[0-9a-f:.]+\])(:[0-9]+)?")


def servers_problem(values: Iterable[object]) -> str | None:
    """Why ``values`` is not a list of servers as image names give them (``host`` or ``host:port``), or None."""
    for value in values:
        text = str(value)
        try:
            url = URL(f"http://{text}/")
            fits = _SERVER.fullmatch(text.lower()) is not None and server_of(url) == text.lower() and url.path == "/"
        except ValueError:
            fits = False
        if not fits:
            return f"{value!r} is not a server as an image names it (host or host:port, e.g. registry.lab:5000)"
    return None


def server_of(url: URL) -> str:
    """``host[:port]`` of ``url`` as it names them (an IPv6 address in brackets), lower case."""
    host = (url.raw_host or "").lower()
    host = f"[{host}]" if ":" in host else host
    return host if url.explicit_port is None else f"{host}:{url.explicit_port}"


def parse(values: Iterable[str]) -> tuple[Network, ...]:
    """The networks of ``values`` (checked by :func:`networks_problem`)."""
    return tuple(ipaddress.ip_network(v, strict=False) for v in values)


def _reached(address: Address) -> Address:
    """The IPv4 address an IPv6 one really reaches when it embeds one (mapped, 6to4, NAT64)."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if address.sixtofour is not None:
            return address.sixtofour
        if address in _NAT64:
            return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address


def refusal(address: str, allowed: Sequence[Network]) -> str | None:
    """Why the platform does not connect to ``address`` for a tenant, or None.

    Public addresses are fine; others only inside ``allowed``. Unspecified and multicast addresses never
    (``0.0.0.0`` reaches the host itself).
    """
    try:
        ip = _reached(ipaddress.ip_address(address.split("%", 1)[0]))
    except ValueError:
        return f"{address!r} is not an IP address"
    if ip.is_unspecified or ip.is_multicast:
        return f"{ip} is an unspecified or multicast address"
    if ip.is_global or any(ip in network for network in allowed):
        return None
    kind = "a loopback" if ip.is_loopback else "a link-local" if ip.is_link_local else "a private or reserved"
    return f"{ip} is {kind} address"


def screen(addresses: Iterable[str], allowed: Sequence[Network]) -> tuple[list[str], list[str]]:
    """The allowed ones of ``addresses`` (in their order), and why the others are refused (each reason once)."""
    kept: list[str] = []
    reasons: list[str] = []
    for address in addresses:
        reason = refusal(address, allowed)
        if reason is None:
            kept.append(address)
        elif reason not in reasons:
            reasons.append(reason)
    return kept, reasons


def allowed_of(host: str, addresses: Iterable[str], allowed: Sequence[Network]) -> list[str]:
    """The addresses ``host`` resolved to that the platform may connect to; :class:`EgressRefused` if none."""
    kept, reasons = screen(addresses, allowed)
    if not kept:
        raise EgressRefused(f"{host}: {'; '.join(reasons) or 'no address'}")
    return kept


def connectable(host: str, port: int, allowed: Sequence[Network]) -> list[str]:
    """The addresses of ``host`` the platform may connect to (blocking resolution), in resolver order.

    Raises :class:`EgressRefused` when it has none (socket.gaierror when the name does not resolve).
    """
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return allowed_of(host, dict.fromkeys(str(info[4][0]) for info in infos), allowed)


async def host_refusal(host: str, allowed: Sequence[Network]) -> str | None:
    """Why ``host`` (an IP address, or a name resolved now) is refused, or None: a name is refused when
    none of its addresses is allowed (whoever connects dials only the allowed ones, checking again), and
    one that does not resolve is None (whoever connects finds that out).
    """
    if _is_address(host):
        return refusal(host, allowed)
    try:
        infos = await anyio.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return None
    return _name_refusal(host, [str(info[4][0]) for info in infos], allowed)


def proxied_refusal(host: str, allowed: Sequence[Network]) -> str | None:
    """:func:`host_refusal` for a request an operator's proxy makes (blocking resolution): the proxy
    resolves the name again and its own rules decide; a name that resolves here only to refused
    addresses is refused, one that does not resolve here (common behind a proxy) is the proxy's.
    """
    if _is_address(host):
        return refusal(host, allowed)
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return None
    return _name_refusal(host, [str(info[4][0]) for info in infos], allowed)


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    return True


def _name_refusal(host: str, addresses: list[str], allowed: Sequence[Network]) -> str | None:
    kept, refused = screen(dict.fromkeys(addresses), allowed)
    if refused and not kept:
        return f"{host} resolves to addresses the platform does not connect to for a tenant ({'; '.join(refused)})"
    return None
