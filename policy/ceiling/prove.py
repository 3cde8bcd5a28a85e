"""Whether a rule allows any request outside a ceiling, with a counter-example when it does.

A rule and each ceiling region are boxes: destinations × ports × methods × paths. The rule
is inside the ceiling when the rule's box minus every region's box is empty. Taking a box
away splits what is left into at most four disjoint boxes (one per dimension where the rest
lies outside the region), so a rule covered only jointly by several regions (ports split
across two, a /24 split across two /25s, `*.a.com` as `b.a.com` plus the rest) is found
inside, and anything left over is a real request: each dimension's set is exact
(policy/ceiling/sets.py, pathlang.py). No I/O.

A `protocol: tcp` rule passes raw bytes; only a region without methods and paths allows
those (the "method" RAW_TCP). A rule without paths also allows paths no glob matches (ones
the gateway cannot read unambiguously, and `*`); a region allows them only without paths.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from sandgate.policy.ceiling.model import Ceiling
from sandgate.policy.ceiling.pathlang import ASTERISK_PATH, UNREADABLE_PATH, PathSet
from sandgate.policy.ceiling.sets import RAW_TCP, DestSet, HostSpace, Intervals, MethodSet
from sandgate.policy.ceiling.shape import RuleShape
from sandgate.policy.matcher import ANY_HOST

__all__ = ["CounterExample", "excess", "lookup_excess", "overlap", "shared"]

_PREFERRED_PORTS = (443, 80, 8080, 8443)


@dataclass(frozen=True, slots=True)
class CounterExample:
    """A concrete request: `method` RAW_TCP for raw bytes (then `path` is None)."""

    method: str
    host: str
    port: int
    path: str | None

    @property
    def raw_tcp(self) -> bool:
        return self.method == RAW_TCP

    @property
    def scheme(self) -> str:
        return "http" if self.port == 80 else "https"

    @property
    def url(self) -> str:
        """The request as a URL (raw TCP: `tcp://host:port`)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        if self.raw_tcp:
            return f"tcp://{host}:{self.port}"
        default = {"http": 80, "https": 443}[self.scheme]
        port = "" if self.port == default else f":{self.port}"
        path = "" if self.path == ASTERISK_PATH else self.path
        return f"{self.scheme}://{host}{port}{path}"

    @property
    def unreadable_path(self) -> bool:
        """Whether the path is one only "every path" allows (the gateway forwards it as sent)."""
        return self.path == UNREADABLE_PATH

    @property
    def asterisk(self) -> bool:
        """Whether the request target is `*` (OPTIONS *), which no glob matches."""
        return self.path == ASTERISK_PATH

    def __str__(self) -> str:
        if self.raw_tcp:
            return self.url
        return f"{self.method} {self.url}" + (" with request target *" if self.asterisk else "")

    def as_dict(self) -> dict[str, object]:
        return {
            "method": None if self.raw_tcp else self.method,
            "raw_tcp": self.raw_tcp,
            "scheme": "tcp" if self.raw_tcp else self.scheme,
            "host": self.host,
            "port": self.port,
            "path": self.path,
            "url": self.url,
        }


@dataclass(frozen=True, slots=True)
class _Box:
    dest: DestSet
    ports: Intervals
    methods: MethodSet
    paths: PathSet

    def cheap_disjoint(self, other: _Box) -> bool:
        """Whether the boxes are disjoint on a dimension other than paths."""
        return not (self.dest & other.dest and self.ports & other.ports and self.methods & other.methods)


def _box(shape: RuleShape, space: HostSpace, *, region: bool) -> _Box:
    if shape.raw_tcp:
        methods = MethodSet(complement=True)
    elif shape.methods is not None:
        methods = MethodSet(frozenset(shape.methods))
    elif region and shape.paths is None:
        methods = MethodSet(complement=True)  # a region without methods and paths: raw TCP too
    else:
        methods = MethodSet(frozenset({RAW_TCP}), complement=True)
    return _Box(
        DestSet.of(space, shape.hosts, shape.cidrs),
        shape.ports,
        methods,
        PathSet.of(None if shape.raw_tcp else shape.paths, deny=shape.deny),
    )


def _minus(box: _Box, region: _Box) -> list[_Box]:
    """`box` minus `region` as disjoint non-empty boxes."""
    if box.cheap_disjoint(region):
        return [box]
    pieces: list[_Box] = []
    rest = box
    dest = rest.dest - region.dest
    if dest:
        pieces.append(replace(rest, dest=dest))
    rest = replace(rest, dest=rest.dest & region.dest)
    ports = rest.ports - region.ports
    if ports:
        pieces.append(replace(rest, ports=ports))
    rest = replace(rest, ports=rest.ports & region.ports)
    methods = rest.methods - region.methods
    if methods:
        pieces.append(replace(rest, methods=methods))
    rest = replace(rest, methods=rest.methods & region.methods)
    # Raw bytes have no path: outside a region that restricts paths, whatever the glob says.
    paths = rest.paths - region.paths
    if paths:
        pieces.append(replace(rest, paths=paths))
    return pieces


def _example(box: _Box) -> CounterExample:
    method = box.methods.pick()
    port = box.ports.pick(_PREFERRED_PORTS)
    host = box.dest.pick()
    if method == RAW_TCP:
        return CounterExample(method, host, port, None)
    path = box.paths.pick()
    assert path is not None  # every box built here is non-empty
    return CounterExample(method, host, port, path)


def _space(shapes: Iterable[RuleShape]) -> HostSpace:
    return HostSpace(h for s in shapes for h in s.hosts)


def excess(rule: RuleShape, ceiling: Ceiling | Sequence[RuleShape]) -> CounterExample | None:
    """A request `rule` allows and no region does, or None when the regions cover the rule."""
    # A region sharing no destination or port with the rule covers none of it: leaving it out
    # changes nothing, and keeps the host cells and boxes to the few regions that matter.
    regions = [r for r in (ceiling.regions if isinstance(ceiling, Ceiling) else ceiling) if _touches(rule, r)]
    space = _space((rule, *regions))
    left = [_box(rule, space, region=False)]
    if not _nonempty(left[0]):
        return None  # a rule whose globs match no path the gateway reads allows nothing
    for region in regions:
        area = _box(region, space, region=True)
        left = [piece for box in left for piece in _minus(box, area)]
        if not left:
            return None
    return _example(left[0])


def lookup_excess(rule: RuleShape, ceiling: Ceiling | Sequence[RuleShape]) -> str | None:
    """A name `rule` names that no region names, or None.

    The gateway looks up any name an allow rule names, whatever deny rules take from the
    rule's requests: its DNS listener answers such names, and a deny rule with methods or
    paths does not apply at CONNECT. A lookup reaches the name's nameservers (an exfiltration
    channel), so a rule whose requests the deny rules cancel still reaches outside through
    names the ceiling does not hold."""
    regions = ceiling.regions if isinstance(ceiling, Ceiling) else ceiling
    if not rule.hosts:
        return None
    space = _space((rule, *regions))
    left = DestSet.of(space, rule.hosts, ())
    for region in regions:
        left = left - DestSet.of(space, region.hosts, ())
        if not left:
            return None
    return left.pick()


def overlap(
    rule: RuleShape, entries: Ceiling | Sequence[RuleShape]
) -> tuple[RuleShape, CounterExample] | None:
    """The first entry sharing a request with `rule`, and that request; for a Ceiling, its
    always-human entries (what an automatic approval must never grant)."""
    regions = entries.always_human if isinstance(entries, Ceiling) else entries
    for region in regions:
        space = _space((rule, region))
        # An entry is matched as a deny rule is: its globs fold case and take the paths the
        # gateway cannot read (an upstream may fold `/REPOS` into `/repos` too).
        a, b = _box(rule, space, region=False), _box(replace(region, deny=True), space, region=True)
        if a.cheap_disjoint(b):
            continue
        both = _Box(a.dest & b.dest, a.ports & b.ports, a.methods & b.methods, a.paths & b.paths)
        if _nonempty(both):
            return region, _example(both)
    return None


def shared(rule: RuleShape, within: RuleShape, takeaway: Sequence[RuleShape] = ()) -> CounterExample | None:
    """A request `rule` allows to a destination and port of `within` (any method and path of
    it) that no shape of `takeaway` covers (each read as a region: deny rules fold case), or None."""
    if not _touches(rule, within):
        return None
    space = _space((rule, within, *takeaway))
    a = _box(rule, space, region=False)
    w = _box(replace(within, methods=None, paths=None, raw_tcp=False), space, region=True)
    left = [_Box(a.dest & w.dest, a.ports & w.ports, a.methods & w.methods, a.paths)]
    if not _nonempty(left[0]):
        return None
    for shape in takeaway:
        area = _box(shape, space, region=True)
        left = [piece for box in left for piece in _minus(box, area)]
        if not left:
            return None
    return _example(left[0])


def _touches(a: RuleShape, b: RuleShape) -> bool:
    """Whether two shapes may share a destination and a port (a cheap, exact pre-check)."""
    if not any(_names_overlap(p, q) for p in a.hosts for q in b.hosts):
        if not a.cidrs or not b.cidrs:
            return False
        x, y = _addresses(a.cidrs), _addresses(b.cidrs)
        if not (x.v4.meets(y.v4) or x.v6.meets(y.v6)):
            return False
    return a.ports.meets(b.ports)


def _names_overlap(p: str, q: str) -> bool:
    """Whether two host patterns match a common name."""
    if p == q or ANY_HOST in (p, q):
        return True
    if p[0] == "*":
        # Two wildcards share names when one suffix ends the other; a name, when it ends in one.
        return q.endswith(p[1:]) or (q[0] == "*" and p.endswith(q[1:]))
    return q[0] == "*" and p.endswith(q[1:])


@functools.lru_cache(maxsize=4096)
def _addresses(cidrs: tuple[str, ...]) -> DestSet:
    return DestSet.of(_NO_NAMES, (), cidrs)


_NO_NAMES = HostSpace(())


def _nonempty(box: _Box) -> bool:
    if not (box.dest and box.ports and box.methods):
        return False
    if box.methods == MethodSet(frozenset({RAW_TCP})):
        return True  # raw bytes need no path
    return bool(box.paths)
