"""Address classes (public, loopback, metadata, ...) and immutable CIDR sets. No I/O.

`classify` is what the address guard asks after resolving and before dialling. IPv6
forms that carry an IPv4 address (mapped, NAT64, 6to4, Teredo, ...) are classified by
that IPv4 address when it is not public, so `::ffff:127.0.0.1` and `64:ff9b::a9fe:a9fe`
are as closed as `127.0.0.1` and `169.254.169.254`.
"""

from __future__ import annotations

import functools
import re
from bisect import bisect_right
from collections.abc import Iterable, Iterator
from enum import StrEnum
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network, ip_network

from sandgate.policy.errors import HostError

__all__ = [
    "GUARDED_RANGES",
    "AddressClass",
    "CidrSet",
    "classify",
    "embedded_ipv4",
    "internal_only",
    "is_public",
    "parse_network",
]

type Network = IPv4Network | IPv6Network
type Address = IPv4Address | IPv6Address

_PREFIX_RE = re.compile(r"0|[1-9][0-9]{0,2}", re.ASCII)
_V4_MASK = 0xFFFF_FFFF
_V4_MAPPED_BASE = 0xFFFF << 32
_MAPPED = IPv6Network("::ffff:0:0/96")


class AddressClass(StrEnum):
    """What kind of destination an address is; only PUBLIC is reachable by default."""

    PUBLIC = "public"
    LOOPBACK = "loopback"
    PRIVATE = "private"
    LINK_LOCAL = "link_local"
    METADATA = "metadata"
    CGNAT = "cgnat"
    MULTICAST = "multicast"
    UNSPECIFIED = "unspecified"
    BROADCAST = "broadcast"
    RESERVED = "reserved"


def _nets4(*texts: str) -> tuple[IPv4Network, ...]:
    """IPv4 networks from literal text."""
    return tuple(IPv4Network(t) for t in texts)


def _nets6(*texts: str) -> tuple[IPv6Network, ...]:
    """IPv6 networks from literal text."""
    return tuple(IPv6Network(t) for t in texts)


# First match wins, so the metadata addresses come before the ranges that hold them.
_V4_TABLE: tuple[tuple[AddressClass, tuple[IPv4Network, ...]], ...] = (
    (
        AddressClass.METADATA,
        _nets4(
            "169.254.169.254/32",  # AWS, GCP, Azure, OpenStack, Oracle, DigitalOcean IMDS
            "169.254.170.2/32",  # AWS ECS task metadata and credentials
            "100.100.100.200/32",  # Alibaba Cloud
            "192.0.0.192/32",  # Oracle Cloud (classic)
            "168.63.129.16/32",  # Azure WireServer / platform endpoint (public-looking)
        ),
    ),
    (AddressClass.UNSPECIFIED, _nets4("0.0.0.0/8")),  # RFC 1122 §3.2.1.3 "this network"
    (AddressClass.LOOPBACK, _nets4("127.0.0.0/8")),  # RFC 1122 §3.2.1.3
    (AddressClass.PRIVATE, _nets4("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16")),  # RFC 1918
    (AddressClass.LINK_LOCAL, _nets4("169.254.0.0/16")),  # RFC 3927
    (AddressClass.CGNAT, _nets4("100.64.0.0/10")),  # RFC 6598 shared address space
    (AddressClass.MULTICAST, _nets4("224.0.0.0/4")),  # RFC 5771
    (AddressClass.BROADCAST, _nets4("255.255.255.255/32")),  # RFC 919 limited broadcast
    (
        AddressClass.RESERVED,
        _nets4(
            "192.0.0.0/24",  # RFC 6890 IETF protocol assignments
            "192.0.2.0/24",  # RFC 5737 TEST-NET-1
            "198.51.100.0/24",  # RFC 5737 TEST-NET-2
            "203.0.113.0/24",  # RFC 5737 TEST-NET-3
            "198.18.0.0/15",  # RFC 2544 benchmarking
            "192.88.99.0/24",  # RFC 7526 deprecated 6to4 relay anycast
            "240.0.0.0/4",  # RFC 1112 §4 reserved ("class E")
        ),
    ),
)

# Checked before looking for an embedded IPv4 address (::1 is not IPv4-compatible 0.0.0.1).
_V6_EXACT: tuple[tuple[AddressClass, tuple[IPv6Network, ...]], ...] = (
    (
        AddressClass.METADATA,
        _nets6(
            "fd00:ec2::254/128",  # AWS IMDS over IPv6
            "fd20:ce::254/128",  # GCP metadata server over IPv6
        ),
    ),
    (AddressClass.UNSPECIFIED, _nets6("::/128")),  # RFC 4291 §2.5.2
    (AddressClass.LOOPBACK, _nets6("::1/128")),  # RFC 4291 §2.5.3
)

_V6_TABLE: tuple[tuple[AddressClass, tuple[IPv6Network, ...]], ...] = (
    (AddressClass.MULTICAST, _nets6("ff00::/8")),  # RFC 4291 §2.7
    (AddressClass.LINK_LOCAL, _nets6("fe80::/10")),  # RFC 4291 §2.5.6
    (
        AddressClass.PRIVATE,
        _nets6(
            "fc00::/7",  # RFC 4193 unique local addresses
            "fec0::/10",  # RFC 3879 deprecated site-local
        ),
    ),
    (
        AddressClass.RESERVED,
        _nets6(
            "100::/64",  # RFC 6666 discard-only
            "2001:2::/48",  # RFC 5180 benchmarking
            "2001:10::/28",  # RFC 4843 ORCHID (deprecated)
            "2001:20::/28",  # RFC 7343 ORCHIDv2
            "2001:db8::/32",  # RFC 3849 documentation
            "3fff::/20",  # RFC 9637 documentation
            "5f00::/16",  # RFC 9602 SRv6 SIDs
        ),
    ),
    (
        AddressClass.PUBLIC,
        _nets6(
            "2000::/3",  # RFC 4291 §2.4 global unicast
            "::ffff:0:0/96",  # IPv4-mapped whose IPv4 is public
            "64:ff9b::/96",  # NAT64 whose IPv4 is public
            "64:ff9b:1::/48",  # local-use NAT64 whose IPv4 is public
        ),
    ),
    # Everything else (the rest of ::/8, unassigned space) falls through to RESERVED.
)


def _bits(value: int, start: int, length: int) -> int:
    """`length` bits of a 128-bit value starting at bit `start` (0 is the most significant)."""
    return (value >> (128 - start - length)) & ((1 << length) - 1)


def embedded_ipv4(ip: IPv6Address) -> tuple[IPv4Address, ...]:
    """Every IPv4 address an IPv6 address carries, most direct first."""
    value = int(ip)
    high96 = value >> 32
    low32 = value & _V4_MASK
    # RFC 4291 §2.5.5.2 IPv4-mapped ::ffff:a.b.c.d: a dual-stack socket dials a.b.c.d.
    if high96 == 0xFFFF:
        return (IPv4Address(low32),)
    # RFC 2765 §2.1 (SIIT) IPv4-translated ::ffff:0:a.b.c.d.
    if high96 == 0xFFFF_0000:
        return (IPv4Address(low32),)
    # RFC 4291 §2.5.5.1 IPv4-compatible ::a.b.c.d (deprecated); :: and ::1 are handled first.
    if high96 == 0:
        return (IPv4Address(low32),)
    # RFC 6052 §2.1 NAT64 well-known prefix 64:ff9b::/96: the IPv4 address is the last 32 bits.
    if high96 == 0x0064_FF9B_0000_0000_0000_0000:
        return (IPv4Address(low32),)
    # RFC 8215 local-use NAT64 prefix 64:ff9b:1::/48; assumed to be used as a /96 (RFC 6052
    # also allows /48../64 layouts with the IPv4 address elsewhere; those are not decoded).
    if value >> 80 == 0x0064_FF9B_0001:
        return (IPv4Address(low32),)
    # RFC 3056 §2 6to4 2002:V4ADDR::/48: the relay dials the IPv4 address in bits 16-47.
    if value >> 112 == 0x2002:
        return (IPv4Address(_bits(value, 16, 32)),)
    # RFC 4380 §4 Teredo 2001:0::/32: server in bits 32-63, client (obfuscated, XOR all
    # ones) in bits 96-127. Both are destinations a relay would reach; check both.
    if value >> 96 == 0x2001_0000:
        client = IPv4Address(low32 ^ _V4_MASK)
        server = IPv4Address(_bits(value, 32, 32))
        return (client, server)
    return ()


def _classify_v4(ip: IPv4Address) -> AddressClass:
    """Class of an IPv4 address."""
    for address_class, networks in _V4_TABLE:
        if any(ip in network for network in networks):
            return address_class
    return AddressClass.PUBLIC


def _classify_v6(ip: IPv6Address) -> AddressClass:
    """Class of an IPv6 address, looking through any embedded IPv4 address."""
    for address_class, networks in _V6_EXACT:
        if any(ip in network for network in networks):
            return address_class
    for embedded in embedded_ipv4(ip):
        embedded_class = _classify_v4(embedded)
        if embedded_class is not AddressClass.PUBLIC:
            return embedded_class
    for address_class, networks in _V6_TABLE:
        if any(ip in network for network in networks):
            return address_class
    return AddressClass.RESERVED


@functools.lru_cache(maxsize=65_536)
def classify(ip: Address) -> AddressClass:
    """The class of an address; IPv4-carrying IPv6 forms take a non-public IPv4's class.
    Cached: every decision classifies the address it will dial, mostly the same few."""
    if isinstance(ip, IPv4Address):
        return _classify_v4(ip)
    if isinstance(ip, IPv6Address):
        return _classify_v6(ip)
    raise TypeError(f"not an IP address: {type(ip).__name__}")


def is_public(ip: Address) -> bool:
    """Whether an address is PUBLIC (the only class reachable without an explicit rule)."""
    return classify(ip) is AddressClass.PUBLIC


def parse_network(text: str) -> Network:
    """An IPv4 or IPv6 network from `addr` or `addr/prefix`, refusing host bits set."""
    if not text or not text.isascii() or any(c.isspace() or c == "%" for c in text):
        raise HostError(f"not a network: {text[:80]!r}")
    _, slash, prefix = text.partition("/")
    if slash and not _PREFIX_RE.fullmatch(prefix):
        raise HostError(f"prefix length must be a decimal number: {text!r}")
    try:
        return ip_network(text, strict=True)
    except ValueError:
        pass
    try:
        loose = ip_network(text, strict=False)
    except ValueError:
        raise HostError(f"not a network: {text!r}") from None
    raise HostError(f"{text!r} has host bits set; use {loose} instead")


class _Intervals:
    """Merged, sorted, closed integer intervals with O(log n) membership."""

    __slots__ = ("_ends", "_starts")

    def __init__(self, spans: Iterable[tuple[int, int]]) -> None:
        starts: list[int] = []
        ends: list[int] = []
        for start, end in sorted(spans):
            if ends and start <= ends[-1] + 1:
                ends[-1] = max(ends[-1], end)
            else:
                starts.append(start)
                ends.append(end)
        self._starts = tuple(starts)
        self._ends = tuple(ends)

    def __contains__(self, value: int) -> bool:
        index = bisect_right(self._starts, value) - 1
        return index >= 0 and value <= self._ends[index]

    def holds(self, start: int, end: int) -> bool:
        """Whether one merged interval contains all of [start, end]."""
        index = bisect_right(self._starts, start) - 1
        return index >= 0 and end <= self._ends[index]


def _span(network: Network) -> tuple[int, int]:
    """First and last address of a network as integers."""
    return int(network.network_address), int(network.broadcast_address)


def _mapped_v4_span(network: IPv6Network) -> tuple[int, int] | None:
    """The IPv4 range a network covers inside ::ffff:0:0/96, if any."""
    start, end = _span(network)
    low = max(start, _V4_MAPPED_BASE)
    high = min(end, _V4_MAPPED_BASE + _V4_MASK)
    if low > high:
        return None
    return low - _V4_MAPPED_BASE, high - _V4_MAPPED_BASE


class CidrSet:
    """An immutable set of IPv4 and IPv6 networks with O(log n) address membership.

    IPv4-mapped IPv6 addresses (::ffff:a.b.c.d) and IPv4 addresses are the same
    destination, so each is found in the set if either spelling is covered.
    """

    __slots__ = ("_networks", "_v4", "_v6")

    def __init__(self, networks: Iterable[Network | str] = ()) -> None:
        parsed: list[Network] = []
        for item in networks:
            if isinstance(item, str):
                parsed.append(parse_network(item))
            elif isinstance(item, IPv4Network | IPv6Network):
                parsed.append(item)
            else:
                raise TypeError(f"not a network: {type(item).__name__}")
        v4_spans: list[tuple[int, int]] = []
        v6_spans: list[tuple[int, int]] = []
        for network in parsed:
            if isinstance(network, IPv4Network):
                v4_spans.append(_span(network))
            else:
                v6_spans.append(_span(network))
                mapped = _mapped_v4_span(network)
                if mapped is not None:
                    v4_spans.append(mapped)
        self._networks = tuple(parsed)
        self._v4 = _Intervals(v4_spans)
        self._v6 = _Intervals(v6_spans)

    def __contains__(self, item: object) -> bool:
        # A wrong type raises instead of answering False: a silent miss in a deny set fails open.
        if isinstance(item, IPv4Address):
            return int(item) in self._v4
        if isinstance(item, IPv6Address):
            mapped = item.ipv4_mapped
            if mapped is not None and int(mapped) in self._v4:
                return True
            return int(item) in self._v6
        raise TypeError(f"CidrSet holds IP addresses, not {type(item).__name__}")

    def __iter__(self) -> Iterator[Network]:
        return iter(self._networks)

    def holds(self, network: Network) -> bool:
        """Whether every address of `network` is in the set (IPv4 also through ::ffff:0:0/96)."""
        start, end = _span(network)
        if isinstance(network, IPv4Network):
            return self._v4.holds(start, end)
        mapped = _mapped_v4_span(network)
        if mapped is not None and network.subnet_of(_MAPPED):
            return self._v4.holds(*mapped)
        return self._v6.holds(start, end)

    def __len__(self) -> int:
        return len(self._networks)

    def __bool__(self) -> bool:
        return bool(self._networks)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CidrSet):
            return NotImplemented
        return frozenset(self._networks) == frozenset(other._networks)

    def __hash__(self) -> int:
        return hash(frozenset(self._networks))

    def __repr__(self) -> str:
        return f"CidrSet([{', '.join(repr(str(n)) for n in self._networks)}])"


# --- which networks hold no public address ---------------------------------------------------

# Every non-public range, as (class, network), for `policy check` to name what a cidr overlaps.
# The IPv6 forms that carry an IPv4 address are listed by their prefix (class: the carried one).
GUARDED_RANGES: tuple[tuple[AddressClass, Network], ...] = (
    *((cls, net) for cls, nets in _V4_TABLE for net in nets),
    *((cls, net) for cls, nets in _V6_EXACT for net in nets),
    *((cls, net) for cls, nets in _V6_TABLE if cls is not AddressClass.PUBLIC for net in nets),
)

_V4_INTERNAL = _Intervals(_span(net) for _, nets in _V4_TABLE for net in nets)
_V6_INTERNAL = _Intervals(
    _span(net) for cls, nets in (*_V6_EXACT, *_V6_TABLE) if cls is not AddressClass.PUBLIC for net in nets
)
# IPv6 prefixes whose last 32 bits are the IPv4 address a relay or dual-stack socket dials.
_LOW32_FAMILIES = tuple(
    IPv6Network(t) for t in ("::ffff:0:0/96", "::ffff:0:0:0/96", "::/96", "64:ff9b::/96", "64:ff9b:1::/48")
)
_6TO4 = IPv6Network("2002::/16")


def internal_only(network: Network) -> bool:
    """Whether every address of `network` is non-public (10.1.5.0/24 yes, 0.0.0.0/0 no).

    A tenant cidr opens a private address only when it is internal-only: a broad rule such
    as `0.0.0.0/0` means "the public internet" and never reaches inside. Undecodable IPv6
    forms (Teredo, unassigned space) count as not internal-only: they open nothing private.
    """
    start, end = _span(network)
    if isinstance(network, IPv4Network):
        return _V4_INTERNAL.holds(start, end)
    if _V6_INTERNAL.holds(start, end):
        return True
    for family in _LOW32_FAMILIES:
        if network.prefixlen >= 96 and network.subnet_of(family):
            return _V4_INTERNAL.holds(start & _V4_MASK, end & _V4_MASK)
    if network.prefixlen >= 16 and network.subnet_of(_6TO4):
        if network.prefixlen < 48:
            return _V4_INTERNAL.holds(_bits(start, 16, 32), _bits(end, 16, 32))
        return _V4_INTERNAL.holds(_bits(start, 16, 32), _bits(start, 16, 32))
    return False
