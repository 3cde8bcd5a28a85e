"""At load: a request is decided by one protocol section at most, and never passed raw.

A section (`mcp:`, `jsonrpc:`, `graphql:`) applies to every request to its rule's hosts (or
networks) and ports, whichever rule allows the request (sandgate.policy.evaluation). So two
allow rules of one tenant (its own and its presets') whose hosts or networks and ports
overlap may not carry different sections (which one would decide?), and a `protocol: tcp`
rule may not overlap a sectioned one (its bytes pass unread). Equal sections may overlap.

What cannot be seen here: a name that resolves into a sectioned network. The gateway
checks that per request (a name's section and its address's network's section differing
is `policy_error`).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from sandgate.policy.errors import PolicyLoadError, SourceLocation
from sandgate.policy.matcher import ANY_HOST
from sandgate.policy.model.tenant import Rule
from sandgate.policy.model.yamlsource import YamlDocument

__all__ = ["WrittenRule", "hosts_overlap", "section_conflicts"]

# What an allow rule without `ports` allows (loader.DEFAULT_ALLOW_PORTS).
_DEFAULT_PORTS = (443,)

type _Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class WrittenRule:
    """An allow rule as written, where: its file, and its index in that file's `allow`."""

    rule: Rule
    doc: YamlDocument
    index: int

    @property
    def kind(self) -> str:
        """The section's field (`mcp`, `jsonrpc`, `graphql`), `protocol` for a tcp rule."""
        r = self.rule
        return "mcp" if r.mcp else "jsonrpc" if r.jsonrpc else "graphql" if r.graphql else "protocol"

    @property
    def key(self) -> str:
        """The section's kind and content: equal keys decide alike."""
        section = self.rule.messages
        return f"{self.kind}:{section.model_dump_json() if section is not None else ''}"

    def location(self) -> SourceLocation:
        return self.doc.locate(("allow", self.index, self.kind))

    def named(self) -> str:
        """`file:line:column field`, as an error names the other rule."""
        loc = ("allow", self.index, self.kind)
        return f"{self.doc.field_name(loc)} ({self.doc.locate(loc)})"

    @property
    def ports(self) -> frozenset[int]:
        return frozenset(self.rule.ports or _DEFAULT_PORTS)


def section_conflicts(rules: Sequence[WrittenRule], tenant: str) -> list[PolicyLoadError]:
    """Each pair of rules that could put two sections (or a section and a raw tunnel) on one
    request, reported at the later one (in the tenant's order: its own rules, then presets)."""
    sectioned = [r for r in rules if r.rule.messages is not None]
    if not sectioned:
        return []
    deciding = [r for r in rules if r.rule.messages is not None or r.rule.protocol == "tcp"]
    errors = []
    for j, later in enumerate(deciding):
        for first in deciding[:j]:
            if first.key == later.key:
                continue  # the same section twice, or two raw tunnels
            shared = _shared(first, later)
            if shared is not None:
                errors.append(_conflict(first, later, shared, tenant))
                break
    return errors


def _conflict(first: WrittenRule, later: WrittenRule, shared: str, tenant: str) -> PolicyLoadError:
    """The error at `later`, naming `first` and what they share."""
    if "protocol" in (first.kind, later.kind):
        kind = first.kind if first.kind != "protocol" else later.kind
        problem = f"'protocol: tcp' passes bytes unread where the '{kind}' section decides each request"
        fix = "give the raw tunnel other hosts or ports"
    else:
        problem = f"two different protocol sections ('{first.kind}' and '{later.kind}') apply to one request"
        fix = "give these hosts and ports one section"
    whose = "" if later.doc is first.doc else f" (tenant {tenant!r})"
    text = (
        f"{problem}{whose}: {first.named()} also covers {shared}; a section applies to every request "
        f"to its hosts and ports, whichever rule allows it: {fix}"
    )
    return PolicyLoadError(later.location(), later.doc.field_name(("allow", later.index, later.kind)), text)


def _shared(a: WrittenRule, b: WrittenRule) -> str | None:
    """What two rules share (`'x' and '*.y' on port 443`), or None when nothing."""
    ports = a.ports & b.ports
    if not ports:
        return None
    on = f" on port {min(ports)}"
    for p in a.rule.hosts:
        for q in b.rule.hosts:
            if hosts_overlap(p, q):
                return f"{p!r} and {q!r}{on}" if p != q else f"{p!r}{on}"
    for x in a.rule.cidrs:
        for y in b.rule.cidrs:
            if _networks_overlap(x, y):
                return f"{x} and {y}{on}" if x != y else f"{x}{on}"
    return None


def hosts_overlap(p: str, q: str) -> bool:
    """Whether two host patterns (`name`, `*.suffix`, `*`) match a common name."""
    if p == q or ANY_HOST in (p, q):
        return True
    if p.startswith("*.") and q.startswith("*."):
        return p.endswith(q[1:]) or q.endswith(p[1:])
    if p.startswith("*."):
        return q.endswith(p[1:])
    return q.startswith("*.") and p.endswith(q[1:])


def _networks_overlap(x: str, y: str) -> bool:
    a, b = _v4(ipaddress.ip_network(x)), _v4(ipaddress.ip_network(y))
    if a.version != b.version:
        return False
    return a.overlaps(b)


_MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")


def _v4(net: _Network) -> _Network:
    """An IPv4-mapped IPv6 network as the IPv4 network it is (the matcher reads them alike)."""
    if isinstance(net, ipaddress.IPv6Network) and net.subnet_of(_MAPPED):
        mapped = net.network_address.ipv4_mapped
        assert mapped is not None
        return ipaddress.IPv4Network(f"{mapped}/{net.prefixlen - 96}")
    return net
