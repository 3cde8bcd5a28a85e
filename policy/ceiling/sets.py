"""Exact sets for the prover: integer intervals (ports, addresses), methods, host name cells.

Each set is closed under intersection and difference and can name a member, which is all
the box arithmetic in `prove` needs. No I/O.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network

from sandgate.policy.matcher import ANY_HOST

__all__ = [
    "ALL_PORTS",
    "RAW_TCP",
    "DestSet",
    "HostSpace",
    "Intervals",
    "MethodSet",
]


@dataclass(frozen=True, slots=True)
class Intervals:
    """A set of integers as sorted, disjoint, non-adjacent closed intervals."""

    spans: tuple[tuple[int, int], ...] = ()

    @staticmethod
    def of(spans: Iterable[tuple[int, int]]) -> Intervals:
        """The union of closed intervals (empty ones dropped), merged."""
        merged: list[tuple[int, int]] = []
        for lo, hi in sorted(s for s in spans if s[0] <= s[1]):
            if merged and lo <= merged[-1][1] + 1:
                merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
            else:
                merged.append((lo, hi))
        return Intervals(tuple(merged))

    def __bool__(self) -> bool:
        return bool(self.spans)

    def __contains__(self, value: int) -> bool:
        return any(lo <= value <= hi for lo, hi in self.spans)

    def meets(self, other: Intervals) -> bool:
        """Whether the sets share a member (without building the intersection)."""
        i = j = 0
        a, b = self.spans, other.spans
        while i < len(a) and j < len(b):
            if a[i][0] <= b[j][1] and b[j][0] <= a[i][1]:
                return True
            if a[i][1] < b[j][1]:
                i += 1
            else:
                j += 1
        return False

    def __and__(self, other: Intervals) -> Intervals:
        out: list[tuple[int, int]] = []
        i = j = 0
        a, b = self.spans, other.spans
        while i < len(a) and j < len(b):
            lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
            if lo <= hi:
                out.append((lo, hi))
            if a[i][1] < b[j][1]:
                i += 1
            else:
                j += 1
        return Intervals(tuple(out))

    def __sub__(self, other: Intervals) -> Intervals:
        out: list[tuple[int, int]] = []
        for lo, hi in self.spans:
            start = lo
            for olo, ohi in other.spans:
                if ohi < start or olo > hi:
                    continue
                if olo > start:
                    out.append((start, olo - 1))
                start = max(start, ohi + 1)
                if start > hi:
                    break
            if start <= hi:
                out.append((start, hi))
        return Intervals(tuple(out))

    def pick(self, preferred: Iterable[int] = ()) -> int:
        """A member: the first preferred one in the set, else the smallest."""
        for value in preferred:
            if value in self:
                return value
        return self.spans[0][0]


ALL_PORTS = Intervals(((1, 65535),))
# ::ffff:0:0/96: an IPv4-mapped IPv6 address is the IPv4 destination (as in CidrSet).
_MAPPED_BASE = 0xFFFF << 32
_MAPPED = Intervals(((_MAPPED_BASE, _MAPPED_BASE + (1 << 32) - 1),))

# Raw TCP bytes (a `protocol: tcp` rule): a "method" only a region without methods and paths allows.
RAW_TCP = "(raw tcp)"
_COMMON_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS")


@dataclass(frozen=True, slots=True)
class MethodSet:
    """Methods (and RAW_TCP): the listed ones, or with `complement` every one but those."""

    names: frozenset[str] = frozenset()
    complement: bool = False

    def __bool__(self) -> bool:
        return self.complement or bool(self.names)

    def __contains__(self, method: str) -> bool:
        return (method in self.names) != self.complement

    def __and__(self, other: MethodSet) -> MethodSet:
        if self.complement and other.complement:
            return MethodSet(self.names | other.names, True)
        if self.complement:
            return MethodSet(other.names - self.names)
        if other.complement:
            return MethodSet(self.names - other.names)
        return MethodSet(self.names & other.names)

    def __sub__(self, other: MethodSet) -> MethodSet:
        return self & MethodSet(other.names, not other.complement)

    def pick(self) -> str:
        """A member, an HTTP method when there is one (a common one when it can)."""
        for method in _COMMON_METHODS:
            if method in self:
                return method
        if self.complement:
            n = 0
            while f"X{n}" in self.names:  # only reached when every common method is excluded
                n += 1
            return f"X{n}"
        http = sorted(self.names - {RAW_TCP})
        return http[0] if http else RAW_TCP


class HostSpace:
    """Every host name, cut into finitely many cells that no pattern of a problem tells apart.

    A pattern is an exact name, `*.suffix` (strict subdomains) or `*` (every name). With the
    anchors (the names and suffixes the patterns mention), a name matches the same patterns
    as one of: an anchor itself, a fresh label under an anchor, or a fresh name under no
    anchor (see `_representatives`). So a set of names is exactly a set of those cells.
    """

    def __init__(self, patterns: Iterable[str]) -> None:
        anchors = {p.removeprefix("*.") for p in patterns if p != ANY_HOST}
        self.cells: tuple[str, ...] = tuple(_representatives(anchors))

    def names(self, patterns: Iterable[str]) -> frozenset[str]:
        """The cells the patterns match."""
        pats = tuple(patterns)
        return frozenset(c for c in self.cells if any(_host_matches(p, c) for p in pats))


def _host_matches(pattern: str, name: str) -> bool:
    """Whether a normalised name matches a pattern, as RuleIndex.named_candidates decides."""
    if pattern == ANY_HOST:
        return True
    if pattern.startswith("*."):
        return name.endswith("." + pattern[2:])
    return name == pattern


def _representatives(anchors: set[str]) -> list[str]:
    """One name per cell: each anchor, a fresh subdomain of each, a fresh unrelated name.

    Why that is all: let `a` be the longest anchor that a name `h` equals or lies under. If
    h == a, it relates to every anchor as `a` does. Otherwise it lies strictly under `a` and
    exactly the anchors that `a` is (under) equal, and `x.a` (not itself an anchor) does the
    same. With no such `a`, h relates to no anchor, like a fresh name under no anchor.
    """
    out: list[str] = []
    for anchor in sorted(anchors, key=lambda a: (a.count("."), a)):
        out.append(anchor)
        out.append(_fresh(anchor, anchors))
    out.append(_fresh_top(anchors))
    return out


def _fresh(anchor: str, anchors: set[str]) -> str:
    """A subdomain of `anchor` that is no anchor."""
    for label in ("x", "y", "z"):
        if f"{label}.{anchor}" not in anchors:
            return f"{label}.{anchor}"
    n = 0
    while f"x{n}.{anchor}" in anchors:
        n += 1
    return f"x{n}.{anchor}"


def _fresh_top(anchors: set[str]) -> str:
    """A name equal to no anchor and under none."""
    n = 0
    while True:
        # The reserved TLDs read best; a made-up one ends the search when anchors hold those.
        for top in ("invalid", "test", f"other{n}"):
            name = f"other{n or ''}.{top}"
            if not any(name == a or name.endswith("." + a) for a in anchors):
                return name
        n += 1


Network = IPv4Network | IPv6Network


@dataclass(frozen=True, slots=True)
class DestSet:
    """Destinations: host-name cells of one HostSpace, IPv4 and IPv6 addresses (as integers).

    IPv4-mapped IPv6 addresses are kept in `v4` (they are the same destination), so `v6`
    never holds ::ffff:0:0/96.
    """

    names: frozenset[str] = frozenset()
    v4: Intervals = Intervals()
    v6: Intervals = Intervals()

    @staticmethod
    def of(space: HostSpace, hosts: Iterable[str], cidrs: Iterable[str]) -> DestSet:
        """The names the host patterns match and the addresses the networks hold."""
        v4: list[tuple[int, int]] = []
        v6: list[tuple[int, int]] = []
        for text in cidrs:
            net: Network = ipaddress.ip_network(text)
            span = (int(net.network_address), int(net.broadcast_address))
            if isinstance(net, IPv4Network):
                v4.append(span)
                continue
            whole = Intervals((span,))
            v6 += (whole - _MAPPED).spans
            v4 += [(lo - _MAPPED_BASE, hi - _MAPPED_BASE) for lo, hi in (whole & _MAPPED).spans]
        return DestSet(space.names(hosts), Intervals.of(v4), Intervals.of(v6))

    def __bool__(self) -> bool:
        return bool(self.names or self.v4 or self.v6)

    def __and__(self, other: DestSet) -> DestSet:
        return DestSet(self.names & other.names, self.v4 & other.v4, self.v6 & other.v6)

    def __sub__(self, other: DestSet) -> DestSet:
        return DestSet(self.names - other.names, self.v4 - other.v4, self.v6 - other.v6)

    def pick(self) -> str:
        """A member: a host name, else an IPv4 address, else an IPv6 one (normalised text)."""
        if self.names:
            return min(self.names, key=lambda n: (n.endswith(".invalid"), n.count("."), n))
        if self.v4:
            return str(IPv4Address(_nice(self.v4)))
        return IPv6Address(_nice(self.v6)).compressed


def _nice(spans: Intervals) -> int:
    """A member, preferring one that is not the first address of a large range (0.0.0.0)."""
    lo, hi = spans.spans[0]
    return lo + 1 if lo == 0 and hi > 0 else lo
