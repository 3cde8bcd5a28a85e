"""Tests for sandgate.policy.addresses: address classes and CIDR sets."""

from __future__ import annotations

import re
from ipaddress import (
    IPv4Address,
    IPv4Network,
    IPv6Address,
    IPv6Network,
    ip_address,
    ip_network,
)

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandgate.policy.addresses import (
    AddressClass,
    CidrSet,
    classify,
    is_public,
    parse_network,
)
from sandgate.policy.errors import HostError

PROPERTY = settings(max_examples=150, deadline=None)
C = AddressClass

# --- classify -------------------------------------------------------------------------

CLASSES = [
    ("8.8.8.8", C.PUBLIC, "a public ipv4 address is public"),
    ("127.0.0.1", C.LOOPBACK, "ipv4 loopback is loopback"),
    ("127.255.255.254", C.LOOPBACK, "all of 127/8 is loopback"),
    ("10.1.2.3", C.PRIVATE, "10/8 is private"),
    ("172.16.0.1", C.PRIVATE, "172.16/12 is private"),
    ("172.32.0.1", C.PUBLIC, "just above 172.16/12 is public"),
    ("192.168.1.1", C.PRIVATE, "192.168/16 is private"),
    ("169.254.1.1", C.LINK_LOCAL, "169.254/16 is link-local"),
    ("169.254.169.254", C.METADATA, "the cloud metadata address is metadata"),
    ("169.254.170.2", C.METADATA, "the ecs task metadata address is metadata"),
    ("100.100.100.200", C.METADATA, "the alibaba metadata address is metadata"),
    ("100.64.1.1", C.CGNAT, "100.64/10 is cgnat"),
    ("100.128.0.1", C.PUBLIC, "just above 100.64/10 is public"),
    ("224.0.0.1", C.MULTICAST, "224/4 is multicast"),
    ("0.0.0.0", C.UNSPECIFIED, "0.0.0.0 is unspecified"),
    ("0.1.2.3", C.UNSPECIFIED, "all of 0/8 is this network"),
    ("255.255.255.255", C.BROADCAST, "the limited broadcast address is broadcast"),
    ("240.0.0.1", C.RESERVED, "240/4 is reserved"),
    ("192.0.2.1", C.RESERVED, "test-net-1 is reserved"),
    ("198.51.100.1", C.RESERVED, "test-net-2 is reserved"),
    ("203.0.113.1", C.RESERVED, "test-net-3 is reserved"),
    ("198.19.0.1", C.RESERVED, "the benchmarking range is reserved"),
    ("192.0.0.8", C.RESERVED, "ietf protocol assignments are reserved"),
    ("2606:4700::1111", C.PUBLIC, "a global unicast ipv6 address is public"),
    ("::1", C.LOOPBACK, "ipv6 loopback is loopback"),
    ("::", C.UNSPECIFIED, "the ipv6 unspecified address is unspecified"),
    ("fd00:ec2::254", C.METADATA, "the aws ipv6 metadata address is metadata"),
    ("fd12:3456::1", C.PRIVATE, "a unique local address is private"),
    ("fe80::1", C.LINK_LOCAL, "fe80::/10 is link-local"),
    ("ff02::1", C.MULTICAST, "ff00::/8 is multicast"),
    ("2001:db8::1", C.RESERVED, "the ipv6 documentation prefix is reserved"),
    ("100::1", C.RESERVED, "the discard prefix is reserved"),
    ("4000::1", C.RESERVED, "unassigned ipv6 space is reserved"),
    ("::ffff:127.0.0.1", C.LOOPBACK, "ipv4-mapped loopback is loopback"),
    ("::ffff:7f00:1", C.LOOPBACK, "ipv4-mapped loopback in hex is loopback"),
    ("::ffff:169.254.169.254", C.METADATA, "ipv4-mapped metadata is metadata"),
    ("::ffff:8.8.8.8", C.PUBLIC, "ipv4-mapped public is public"),
    ("::127.0.0.1", C.LOOPBACK, "ipv4-compatible loopback is loopback"),
    ("::8.8.8.8", C.RESERVED, "ipv4-compatible public is reserved, as deprecated"),
    ("::ffff:0:10.0.0.1", C.PRIVATE, "ipv4-translated private is private"),
    ("2002:7f00:1::", C.LOOPBACK, "6to4 of loopback is loopback"),
    ("2002:a9fe:a9fe::1", C.METADATA, "6to4 of metadata is metadata"),
    ("2002:808:808::1", C.PUBLIC, "6to4 of a public address is public"),
    ("64:ff9b::a9fe:a9fe", C.METADATA, "nat64 of metadata is metadata"),
    ("64:ff9b::10.0.0.1", C.PRIVATE, "nat64 of a private address is private"),
    ("64:ff9b::8.8.8.8", C.PUBLIC, "nat64 of a public address is public"),
    ("64:ff9b:1::7f00:1", C.LOOPBACK, "local-use nat64 of loopback is loopback"),
    ("2001:0:4136:e378:8000:63bf:80ff:fffe", C.LOOPBACK, "teredo with a loopback client"),
    ("2001:0:7f00:1:8000:63bf:f7f7:f7f7", C.LOOPBACK, "teredo with a loopback server"),
    ("2001:0:808:808:0:0:f7f7:f7f7", C.PUBLIC, "teredo with public client and server"),
]


@pytest.mark.parametrize(("text", "expected"), [c[:2] for c in CLASSES], ids=[c[2] for c in CLASSES])
def test_classify(text: str, expected: AddressClass) -> None:
    assert classify(ip_address(text)) is expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [("8.8.8.8", True), ("10.0.0.1", False), ("::ffff:8.8.8.8", True), ("::1", False)],
    ids=[
        "a public address is public",
        "a private address is not public",
        "a mapped public address is public",
        "ipv6 loopback is not public",
    ],
)
def test_is_public(text: str, expected: bool) -> None:
    assert is_public(ip_address(text)) is expected


def test_address_classes_are_strings() -> None:
    assert str(AddressClass.LINK_LOCAL) == "link_local"


_NON_PUBLIC_V4 = [
    ip_network(n)
    for n in (
        "0.0.0.0/8",
        "10.0.0.0/8",
        "100.64.0.0/10",
        "127.0.0.0/8",
        "169.254.0.0/16",
        "169.254.169.254/32",
        "172.16.0.0/12",
        "192.0.2.0/24",
        "192.168.0.0/16",
        "198.18.0.0/15",
        "224.0.0.0/4",
        "240.0.0.0/4",
    )
]


@st.composite
def _non_public_v4(draw: st.DrawFn) -> IPv4Address:
    """A random address inside one of the non-public IPv4 ranges."""
    network = draw(st.sampled_from(_NON_PUBLIC_V4))
    offset = draw(st.integers(min_value=0, max_value=network.num_addresses - 1))
    address = network.network_address + offset
    assert isinstance(address, IPv4Address)
    return address


def _embeddings(v4: IPv4Address, noise: int) -> list[IPv6Address]:
    """IPv6 spellings of v4: mapped, nat64, local-use nat64, 6to4, teredo client and server."""
    value = int(v4)
    low80 = noise & ((1 << 80) - 1)
    return [
        IPv6Address((0xFFFF << 32) | value),
        IPv6Address((0x64FF9B << 96) | value),
        IPv6Address((0x64FF9B0001 << 80) | (noise & ((1 << 48) - 1)) << 32 | value),
        IPv6Address((0x2002 << 112) | (value << 80) | low80),
        IPv6Address((0x20010000 << 96) | (0x08080808 << 64) | (value ^ 0xFFFFFFFF)),
        IPv6Address((0x20010000 << 96) | (value << 64) | 0xF7F7F7F7),
    ]


@PROPERTY
@given(_non_public_v4(), st.integers(min_value=0, max_value=2**80 - 1))
def test_embedded_non_public_ipv4_classifies_as_the_ipv4(v4: IPv4Address, noise: int) -> None:
    expected = classify(v4)
    assert expected is not AddressClass.PUBLIC
    for v6 in _embeddings(v4, noise):
        assert classify(v6) is expected, str(v6)


# --- parse_network --------------------------------------------------------------------

NETWORKS = [
    ("10.0.0.0/8", IPv4Network("10.0.0.0/8"), "an ipv4 network is parsed"),
    ("10.0.0.1", IPv4Network("10.0.0.1/32"), "a bare ipv4 address is a /32"),
    ("2001:DB8::/32", IPv6Network("2001:db8::/32"), "an ipv6 network is parsed"),
    ("::1", IPv6Network("::1/128"), "a bare ipv6 address is a /128"),
    ("0.0.0.0/0", IPv4Network("0.0.0.0/0"), "the whole ipv4 space is allowed"),
]


@pytest.mark.parametrize(("text", "expected"), [c[:2] for c in NETWORKS], ids=[c[2] for c in NETWORKS])
def test_parse_network(text: str, expected: IPv4Network | IPv6Network) -> None:
    assert parse_network(text) == expected


NETWORKS_BAD = [
    ("10.0.0.1/8", "use 10.0.0.0/8 instead", "host bits set names the network to use"),
    ("fd00::1/8", "use fd00::/8 instead", "ipv6 host bits set names the network to use"),
    ("10.0.0.0/08", "prefix length", "a zero-padded prefix length is refused"),
    ("10.0.0.0/255.0.0.0", "prefix length", "a netmask is refused"),
    ("10.0.0.0/33", "not a network", "a prefix length too long is refused"),
    ("010.0.0.0/8", "not a network", "a zero-padded octet is refused"),
    ("fe80::%eth0/64", "not a network", "a zone id is refused"),
    (" 10.0.0.0/8", "not a network", "surrounding whitespace is refused"),
    ("", "not a network", "an empty string is refused"),
    ("example.com", "not a network", "a hostname is refused"),
]


@pytest.mark.parametrize(("text", "problem"), [c[:2] for c in NETWORKS_BAD], ids=[c[2] for c in NETWORKS_BAD])
def test_parse_network_refuses(text: str, problem: str) -> None:
    with pytest.raises(HostError, match=re.escape(problem)):
        parse_network(text)


# --- CidrSet --------------------------------------------------------------------------

_SET = CidrSet(["10.0.0.0/8", IPv4Network("192.168.0.0/16"), "fd00::/8", "10.1.0.0/16"])

MEMBERSHIP = [
    ("10.2.3.4", True, "an address inside a network is a member"),
    ("11.0.0.0", False, "an address just past a network is not a member"),
    ("9.255.255.255", False, "an address just before a network is not a member"),
    ("192.168.255.255", True, "the last address of a network is a member"),
    ("fd12::1", True, "an ipv6 address inside a network is a member"),
    ("fe00::1", False, "an ipv6 address outside every network is not a member"),
    ("::ffff:10.0.0.1", True, "an ipv4-mapped address is looked up as its ipv4"),
    ("::ffff:8.8.8.8", False, "a mapped address outside the ipv4 networks is not a member"),
    ("::a00:1", False, "an ipv4-compatible address is not looked up as ipv4"),
]


@pytest.mark.parametrize(("text", "expected"), [c[:2] for c in MEMBERSHIP], ids=[c[2] for c in MEMBERSHIP])
def test_cidr_set_membership(text: str, expected: bool) -> None:
    assert (ip_address(text) in _SET) is expected


def test_cidr_set_keeps_the_original_networks_in_order() -> None:
    assert list(_SET) == [
        IPv4Network("10.0.0.0/8"),
        IPv4Network("192.168.0.0/16"),
        IPv6Network("fd00::/8"),
        IPv4Network("10.1.0.0/16"),
    ]
    assert len(_SET) == 4
    assert bool(_SET)


def test_an_empty_cidr_set_is_false_and_contains_nothing() -> None:
    empty = CidrSet()
    assert not empty
    assert len(empty) == 0
    assert IPv4Address("0.0.0.0") not in empty


def test_a_mapped_ipv6_network_covers_the_ipv4_addresses() -> None:
    cidrs = CidrSet(["::ffff:127.0.0.0/104"])
    assert IPv4Address("127.0.0.1") in cidrs
    assert IPv6Address("::ffff:127.0.0.1") in cidrs
    assert IPv4Address("128.0.0.1") not in cidrs


def test_cidr_set_refuses_a_string_lookup_instead_of_failing_open() -> None:
    with pytest.raises(TypeError):
        assert "10.0.0.1" in _SET


def test_cidr_set_refuses_a_network_with_host_bits() -> None:
    with pytest.raises(HostError, match=re.escape("use 10.0.0.0/8 instead")):
        CidrSet(["10.0.0.1/8"])


def test_cidr_sets_with_the_same_networks_are_equal() -> None:
    assert CidrSet(["10.0.0.0/8", "::/0"]) == CidrSet(["::/0", "10.0.0.0/8"])
    assert hash(CidrSet(["10.0.0.0/8"])) == hash(CidrSet([IPv4Network("10.0.0.0/8")]))
    assert repr(CidrSet(["10.0.0.0/8"])) == "CidrSet(['10.0.0.0/8'])"


# --- CidrSet against brute force ------------------------------------------------------

_V4_MAPPED = 0xFFFF << 32


@st.composite
def _networks(draw: st.DrawFn) -> IPv4Network | IPv6Network:
    """A random IPv4, IPv6 or IPv4-mapped IPv6 network."""
    kind = draw(st.sampled_from(["v4", "v6", "mapped"]))
    if kind == "v4":
        value = draw(st.integers(min_value=0, max_value=2**32 - 1))
        return IPv4Network((value, draw(st.integers(min_value=0, max_value=32))), strict=False)
    if kind == "v6":
        value = draw(st.integers(min_value=0, max_value=2**128 - 1))
        return IPv6Network((value, draw(st.integers(min_value=0, max_value=128))), strict=False)
    value = _V4_MAPPED | draw(st.integers(min_value=0, max_value=2**32 - 1))
    return IPv6Network((value, draw(st.integers(min_value=96, max_value=128))), strict=False)


def _same_destination(address: IPv4Address | IPv6Address) -> list[IPv4Address | IPv6Address]:
    """An address and its IPv4 / IPv4-mapped twin."""
    if isinstance(address, IPv4Address):
        return [address, IPv6Address(_V4_MAPPED | int(address))]
    if address.ipv4_mapped is not None:
        return [address, address.ipv4_mapped]
    return [address]


def _address(version: int, value: int) -> IPv4Address | IPv6Address:
    """The address of a version with an integer value."""
    return IPv4Address(value) if version == 4 else IPv6Address(value)


@PROPERTY
@given(st.lists(_networks(), max_size=12), st.data())
def test_cidr_set_agrees_with_brute_force(nets: list[IPv4Network | IPv6Network], data: st.DataObject) -> None:
    cidrs = CidrSet(nets)
    candidates: list[IPv4Address | IPv6Address] = []
    for net in nets:
        # Edges of each network and just outside them, where off-by-ones live.
        for value in (int(net.network_address), int(net.broadcast_address)):
            for delta in (-1, 0, 1):
                if 0 <= value + delta < 2**net.max_prefixlen:
                    candidates.append(_address(net.version, value + delta))
    candidates.append(data.draw(st.ip_addresses()))
    candidates.append(IPv6Address(_V4_MAPPED | int(data.draw(st.ip_addresses(v=4)))))
    for address in candidates:
        expected = any(twin in net for twin in _same_destination(address) for net in nets)
        assert (address in cidrs) is expected, str(address)
