"""Tests for sandgate.policy.address_guard: the operator's address guard, which no tenant rule opens."""

from __future__ import annotations

from dataclasses import dataclass
from ipaddress import IPv4Address, IPv6Address, ip_address, ip_network

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandgate.policy.address_guard import AddressGuard
from sandgate.policy.addresses import AddressClass, classify, internal_only

PROPERTY = settings(max_examples=200, deadline=None)

# The operator opens 10.1.5.0/24 and 198.51.100.0/24 to tenants whose own cidr covers them,
# 10.20.0.0/16 to names, and even (mistakenly) the link-local /16 that holds the metadata address.
OPERATOR = AddressGuard(
    reachable_by_name=["10.20.0.0/16", "169.254.0.0/16"],
    own_addresses=["192.0.2.2", "198.51.100.2", "93.184.216.41", "fd00::2", "::ffff:10.1.5.9"],
    tenant_reachable=["10.1.5.0/24", "198.51.100.0/24", "169.254.0.0/16", "fd12::/16", "127.0.0.0/8"],
)


@dataclass(frozen=True)
class Case:
    why: str
    ip: str
    permitted: bool
    by_name: bool = False
    tenant_opens: bool = False
    public_only: bool = False
    refusal: str = ""


CASES = [
    Case("a public address is permitted", "93.184.216.34", True),
    Case("a public ipv6 address is permitted", "2606:2800:220:1::1", True),
    Case("the gateway's own public address is refused", "93.184.216.41", False, refusal="gateway itself"),
    Case(
        "the gateway's own address is refused even where the operator and the tenant open its range",
        "198.51.100.2",
        False,
        tenant_opens=True,
        refusal="gateway itself",
    ),
    Case(
        "another address of an opened range the tenant covers is permitted",
        "198.51.100.9",
        True,
        tenant_opens=True,
    ),
    Case("the ipv4-mapped form of an own address is refused", "::ffff:93.184.216.41", False),
    Case("the nat64 form of an own address is refused", "64:ff9b::5db8:d829", False),
    Case("the 6to4 form of an own address is refused", "2002:5db8:d829::1", False),
    Case("an own address listed in mapped form is refused as ipv4", "10.1.5.9", False, tenant_opens=True),
    Case("an own ipv6 address is refused", "fd00::2", False, by_name=True),
    Case(
        "the metadata address is refused though the operator and the tenant open its range",
        "169.254.169.254",
        False,
        by_name=True,
        tenant_opens=True,
        refusal="metadata",
    ),
    Case("the mapped metadata address is refused", "::ffff:169.254.169.254", False, tenant_opens=True),
    Case("the nat64 metadata address is refused", "64:ff9b::a9fe:a9fe", False, tenant_opens=True),
    Case("the aws ipv6 metadata address is refused", "fd00:ec2::254", False, tenant_opens=True),
    Case(
        "another link-local address the operator opens by name is permitted",
        "169.254.1.1",
        True,
        by_name=True,
    ),
    Case("an unspecified address is refused", "0.0.0.0", False, tenant_opens=True, refusal="unspecified"),
    Case("the ipv6 unspecified address is refused", "::", False, tenant_opens=True),
    Case("a multicast address is refused", "224.0.0.1", False, tenant_opens=True, refusal="multicast"),
    Case("the limited broadcast address is refused", "255.255.255.255", False, tenant_opens=True),
    Case("a tenant cidr alone never opens a private address", "10.9.9.9", False, tenant_opens=True),
    Case("an opened private address without a tenant cidr is refused", "10.1.5.3", False),
    Case(
        "an opened private address reached by name without a tenant cidr is refused",
        "10.1.5.3",
        False,
        by_name=True,
    ),
    Case("an opened private address a tenant cidr covers is permitted", "10.1.5.3", True, tenant_opens=True),
    Case(
        "the mapped form of an opened private address a tenant cidr covers is permitted",
        "::ffff:10.1.5.3",
        True,
        tenant_opens=True,
    ),
    Case(
        "the nat64 form of an opened private address is refused (a translator is another hop)",
        "64:ff9b::a01:503",
        False,
        tenant_opens=True,
    ),
    Case("an opened ula address a tenant cidr covers is permitted", "fd12::7", True, tenant_opens=True),
    Case("a cgnat address is refused", "100.64.0.1", False, by_name=True, tenant_opens=True),
    Case("a reserved address is refused", "192.0.2.7", False, tenant_opens=True, refusal="reserved"),
    Case("a by-name range is refused for a raw ip", "10.20.1.1", False),
    Case("a by-name range is permitted for a name a rule names", "10.20.1.1", True, by_name=True),
    Case(
        "a by-name range is refused for a name only hosts star allows",
        "10.20.1.1",
        False,
        by_name=True,
        public_only=True,
    ),
    Case(
        "an opened loopback address a tenant cidr covers is permitted (the operator's explicit choice)",
        "127.0.0.2",
        True,
        tenant_opens=True,
    ),
    Case("loopback is refused without an operator range", "::1", False, by_name=True, tenant_opens=True),
]


@pytest.mark.parametrize("case", CASES, ids=[c.why for c in CASES])
def test_refusal(case: Case) -> None:
    refusal = OPERATOR.refusal(
        ip_address(case.ip),
        by_name=case.by_name,
        tenant_opens=case.tenant_opens,
        public_only=case.public_only,
    )
    assert (refusal is None) is case.permitted, refusal
    assert case.refusal in (refusal or "")


def test_a_default_guard_opens_nothing_but_public_addresses() -> None:
    guard = AddressGuard()
    for text in ("127.0.0.2", "10.1.5.3", "169.254.1.1", "fd12::7", "100.64.0.1", "198.51.100.9"):
        assert not guard.permits(ip_address(text), by_name=True, tenant_opens=True), text
    assert guard.permits(ip_address("93.184.216.34"), by_name=False, tenant_opens=False)


def test_a_new_own_address_set_is_a_new_guard_with_the_same_ranges() -> None:
    fresh = OPERATOR.with_own_addresses(["198.51.100.3"])
    old_own, new_own = ip_address("198.51.100.2"), ip_address("198.51.100.3")
    assert OPERATOR.permits(new_own, by_name=False, tenant_opens=True), "the old guard is unchanged"
    assert not fresh.permits(new_own, by_name=False, tenant_opens=True)
    assert fresh.permits(old_own, by_name=False, tenant_opens=True)
    assert fresh.permits(ip_address("10.20.1.1"), by_name=True, tenant_opens=False)


# --- properties -----------------------------------------------------------------------------


def _embeddings(v4: IPv4Address, noise: int) -> list[IPv6Address]:
    """IPv6 spellings that carry v4: mapped, SIIT, compatible, nat64, local nat64, 6to4, teredo."""
    value = int(v4)
    return [
        IPv6Address((0xFFFF << 32) | value),
        IPv6Address((0xFFFF0000 << 32) | value),
        IPv6Address(value if value > 1 else value | 0x0100_0000),
        IPv6Address((0x64FF9B << 96) | value),
        IPv6Address((0x64FF9B0001 << 80) | (noise & ((1 << 48) - 1)) << 32 | value),
        IPv6Address((0x2002 << 112) | (value << 80) | (noise & ((1 << 80) - 1))),
        IPv6Address((0x20010000 << 96) | (0x08080808 << 64) | (value ^ 0xFFFFFFFF)),
    ]


@PROPERTY
@given(st.integers(min_value=0, max_value=2**32 - 1), st.integers(min_value=0, max_value=2**80 - 1))
def test_no_ipv6_spelling_reaches_what_the_ipv4_address_cannot(value: int, noise: int) -> None:
    """A tenant covering everything, and the operator opening nothing: whatever IPv4 address is
    refused stays refused in every IPv6 form that carries it."""
    guard = AddressGuard(own_addresses=["93.184.216.41"])
    v4 = IPv4Address(value)
    if guard.permits(v4, by_name=True, tenant_opens=True):
        return
    for v6 in _embeddings(v4, noise):
        assert not guard.permits(v6, by_name=True, tenant_opens=True), str(v6)


@PROPERTY
@given(st.sampled_from(["93.184.216.41", "8.8.4.4", "1.1.1.1"]), st.integers(0, 2**80 - 1))
def test_an_own_public_address_is_refused_in_every_spelling(own: str, noise: int) -> None:
    guard = AddressGuard(own_addresses=[own])
    spellings: list[IPv4Address | IPv6Address] = [IPv4Address(own), *_embeddings(IPv4Address(own), noise)]
    for ip in spellings:
        assert not guard.permits(ip, by_name=True, tenant_opens=True), str(ip)


@st.composite
def _networks(draw: st.DrawFn) -> IPv4Address | IPv6Address:
    version = draw(st.sampled_from([4, 6]))
    bits = 32 if version == 4 else 128
    prefix = draw(st.integers(min_value=0, max_value=bits))
    value = draw(st.integers(min_value=0, max_value=2**bits - 1))
    return ip_network(((value >> (bits - prefix)) << (bits - prefix) if prefix else 0, prefix))  # type: ignore[return-value]


@PROPERTY
@given(_networks(), st.data())
def test_an_internal_only_network_holds_no_public_address(network: object, data: st.DataObject) -> None:
    """What lets a tenant cidr open an internal address must never also cover a public one."""
    assert not isinstance(network, IPv4Address | IPv6Address)
    net = ip_network(str(network))
    if not internal_only(net):
        return
    for _ in range(8):
        offset = data.draw(st.integers(min_value=0, max_value=net.num_addresses - 1))
        address = net.network_address + offset
        assert classify(address) is not AddressClass.PUBLIC, str(address)


INTERNAL = [
    ("10.1.5.0/24", True, "a private /24 is internal-only"),
    ("10.0.0.0/8", True, "all of 10/8 is internal-only"),
    ("127.0.0.0/8", True, "loopback is internal-only"),
    ("fc00::/7", True, "ula is internal-only"),
    ("::ffff:10.0.0.0/104", True, "mapped 10/8 is internal-only"),
    ("64:ff9b::a00:0/104", True, "nat64 10/8 is internal-only"),
    ("2002:a00::/24", True, "6to4 10/8 is internal-only"),
    ("0.0.0.0/0", False, "all of ipv4 is broad"),
    ("::/0", False, "all of ipv6 is broad"),
    ("8.0.0.0/6", False, "a range holding 10/8 and public space is broad"),
    ("::ffff:0:0/96", False, "all mapped addresses are broad"),
    ("2002::/16", False, "all of 6to4 is broad"),
    ("2000::/3", False, "global unicast is broad"),
    ("2001::/32", False, "teredo is not decoded: broad"),
]


@pytest.mark.parametrize(("text", "expected"), [c[:2] for c in INTERNAL], ids=[c[2] for c in INTERNAL])
def test_internal_only(text: str, expected: bool) -> None:
    assert internal_only(ip_network(text)) is expected
