"""Which addresses the platform connects to for a tenant: public ones, and the networks its operator lists."""

from __future__ import annotations

import re

import pytest
from yarl import URL

from nvcf_mono.contracts.egress import (
    EgressRefused,
    connectable,
    networks_problem,
    parse,
    refusal,
    server_of,
    servers_problem,
)


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("127.0.0.1", "127.0.0.1 is a loopback address"),
        ("::1", "::1 is a loopback address"),
        ("169.254.169.254", "169.254.169.254 is a link-local address"),
        ("fe80::1%eth0", "fe80::1 is a link-local address"),
        ("10.1.2.3", "10.1.2.3 is a private or reserved address"),
        ("172.16.0.1", "private or reserved"),
        ("192.168.0.1", "private or reserved"),
        ("100.64.0.1", "private or reserved"),  # carrier-grade NAT
        ("fd12::1", "private or reserved"),
        ("192.0.2.1", "private or reserved"),  # documentation
        ("0.0.0.0", "0.0.0.0 is an unspecified or multicast address"),  # reaches this host
        ("::", "unspecified or multicast"),
        ("224.0.0.251", "unspecified or multicast"),
        # IPv6 forms that reach an IPv4 address are judged by the address they reach.
        ("::ffff:127.0.0.1", "127.0.0.1 is a loopback address"),
        ("2002:a9fe:a9fe::1", "169.254.169.254 is a link-local address"),  # 6to4
        ("64:ff9b::7f00:1", "127.0.0.1 is a loopback address"),  # NAT64
        ("not-an-ip", "'not-an-ip' is not an IP address"),
    ],
)
def test_what_is_not_public_is_refused_saying_what_it_is(address: str, why: str) -> None:
    found = refusal(address, ())
    assert found is not None and why in found, found


@pytest.mark.parametrize("address", ["8.8.8.8", "2606:4700:4700::1111", "::ffff:8.8.8.8", "64:ff9b::808:808"])
def test_public_addresses_are_fine(address: str) -> None:
    assert refusal(address, ()) is None


def test_the_operator_lists_networks_but_never_unspecified_or_multicast() -> None:
    allowed = parse(["10.0.0.0/8", "127.0.0.1", "::1/128", "0.0.0.0/0"])
    for address in ("10.200.0.1", "127.0.0.1", "::1", "::ffff:10.0.0.5", "169.254.169.254"):
        assert refusal(address, allowed) is None, address
    assert refusal("0.0.0.0", allowed) is not None and refusal("239.1.1.1", allowed) is not None
    assert refusal("127.0.0.2", parse(["127.0.0.1/32"])) == "127.0.0.2 is a loopback address"


def test_networks_are_checked() -> None:
    assert networks_problem(["10.0.0.0/8", "fd00::/8", "192.168.1.7"]) is None
    problem = networks_problem(["10.0.0.0/8", "10.0.0.0/33"])
    assert problem is not None and problem.startswith("'10.0.0.0/33' is not a network in CIDR notation")
    assert networks_problem(["intranet"]) is not None


def test_servers_are_named_as_images_name_registries() -> None:
    assert servers_problem(["registry.lab:5000", "REG", "10.0.0.5", "[fd00::5]:5000"]) is None
    for wrong in ("http://registry.lab", "registry.lab/v2", "alice@registry.lab", "registry.lab:http", "a b", ""):
        problem = servers_problem(["registry.lab", wrong])
        assert problem is not None and problem.startswith(f"{wrong!r} is not a server as an image names it"), wrong
    assert server_of(URL("http://Registry.Lab:5000/v2/")) == "registry.lab:5000"
    assert server_of(URL("http://[fd00::5]/v2/")) == "[fd00::5]"


def test_a_name_is_connectable_only_at_its_allowed_addresses() -> None:
    with pytest.raises(EgressRefused, match=r"localhost: .*127\.0\.0\.1 is a loopback address"):
        connectable("localhost", 80, ())
    assert "127.0.0.1" in connectable("localhost", 80, parse(["127.0.0.0/8"]))
    assert connectable("127.0.0.1", 80, parse(["127.0.0.0/8"])) == ["127.0.0.1"]


@pytest.mark.parametrize("host", ["2130706433", "0x7f.1", "0177.0.0.1", "127.1"])
def test_a_legacy_or_dotted_form_of_loopback_is_refused_once_resolved(host: str) -> None:
    with pytest.raises(EgressRefused, match=re.escape("127.0.0.1 is a loopback address")):
        connectable(host, 80, ())
