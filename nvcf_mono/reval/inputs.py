"""Input checks of a render or validation request: the chart URL and the Kubernetes version."""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

# Go's IsPrivate (RFC 1918 and ULA), not Python's wider "not globally reachable".
_PRIVATE = tuple(
    ipaddress.ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "fc00::/7")
)
_KUBE_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?(?:[-+].*)?$")


def is_private_ip(text: str) -> bool:
    """Loopback, private (RFC 1918, ULA), unspecified, link-local, interface-local multicast or 100.64/10.

    Host names are never private here (they are resolved, and refused, when fetched).
    """
    try:
        address = ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address.is_loopback or address.is_unspecified or address.is_link_local:
        return True
    if any(address.version == net.version and address in net for net in _PRIVATE):
        return True
    if isinstance(address, ipaddress.IPv4Address):
        return False
    # ff01::/16 interface-local and ff02::/16 link-local multicast
    return address.is_multicast and (address.packed[1] & 0x0F) in (1, 2)


def chart_url_errors(url: str) -> list[str]:
    """What is wrong with a chart URL (scheme https or oci, a host, not a private address)."""
    try:
        parts = urlsplit(url)
        if " " in parts.netloc:
            raise ValueError(f"invalid character {' '!r} in host name")
        host = parts.hostname or ""
    except ValueError as err:
        return [f"invalid helm chart URL: {err}"]
    errors = []
    if parts.scheme not in ("https", "oci"):
        errors.append(f"helm chart URL must use https or oci scheme, got {parts.scheme!r}")
    if not host:
        errors.append("helm chart URL must have a host")
    elif is_private_ip(host):
        errors.append("helm chart URL must not point to private networks")
    return errors


def kube_version_error(version: str | None) -> str | None:
    if not version:
        return None
    if _KUBE_VERSION.match(version.strip()) is None:
        return f"invalid kube version {version!r}: expected v<major>.<minor>[.<patch>]"
    return None


def is_local_chart(chart: str) -> bool:
    """A chart on this machine (a path or ``file://``), allowed only in development."""
    return chart.startswith("file://") or "://" not in chart
