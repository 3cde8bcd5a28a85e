"""The allowlist matcher: hash lookups and suffix walks, never a scan over tenants or rules.

A tenant's rules are indexed by exact host, by wildcard suffix, by network, and the
`hosts: ["*"]` rules apart (any name, never an IP literal, tried after every rule that names
the host). Matching a host costs one dict lookup plus one per label (the suffix walk);
networks use a CidrSet.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from sandgate.policy.addresses import CidrSet, internal_only, parse_network
from sandgate.policy.reasons import Reason
from sandgate.policy.upgrade import WEBSOCKET

if TYPE_CHECKING:  # pydantic models: loaded with the policy files, not with every decision
    from sandgate.policy.protocols.rules import GraphqlSection, JsonRpcSection, McpSection

__all__ = [
    "ANY_HOST",
    "ANY_PORT",
    "UNPARSEABLE_PATH",
    "CompiledRule",
    "RuleIndex",
    "RuleMatch",
    "compile_path_globs",
]

ANY_PORT: frozenset[int] = frozenset()
# `hosts: ["*"]`: any name the gateway resolves to an address the guard permits.
ANY_HOST = "*"

# Stands for a path that cannot be normalised unambiguously (encoded slash, backslash, NUL):
# it matches no allow glob and every deny glob, so an upstream's reading of it cannot bypass either.
UNPARSEABLE_PATH = "\x00unparseable"


@dataclass(frozen=True, slots=True)
class CompiledRule:
    """A rule ready for matching; `ports` empty means any port."""

    rule_id: str
    ports: frozenset[int]
    methods: frozenset[str] | None
    paths: re.Pattern[str] | None
    inspect: bool
    hosts: tuple[str, ...] = ()
    cidrs: tuple[str, ...] = ()
    # Where the rule was written (`file:line`), for explain and audit.
    origin: str = ""
    # A `protocol: tcp` rule: raw bytes may pass, not only HTTP and TLS.
    raw_tcp: bool = False
    # `websocket: true`: a WebSocket upgrade may pass (its messages are still checked).
    websocket: bool = False
    # `mcp:`, `jsonrpc:` or `graphql:`: each request's messages are decided by this section.
    messages: McpSection | JsonRpcSection | GraphqlSection | None = field(default=None, compare=False)

    def port_ok(self, port: int) -> bool:
        return not self.ports or port in self.ports

    def method_ok(self, method: str | None) -> bool:
        return self.methods is None or method is None or method in self.methods

    def path_ok(self, path: str | None) -> bool:
        return self.paths is None or path is None or self.paths.fullmatch(path) is not None

    def upgrade_ok(self, upgrade: str | None) -> bool:
        """No protocol switch, or a WebSocket one on a rule that allows it; nothing else."""
        return upgrade is None or (upgrade == WEBSOCKET and self.websocket)

    def deny_path_hit(self, path: str | None) -> bool:
        """For deny rules: an unparseable path counts as a hit."""
        if self.paths is not None and path == UNPARSEABLE_PATH:
            return True
        return self.path_ok(path)

    @property
    def per_request(self) -> bool:
        """Whether this rule only decides once method and path are known."""
        return self.methods is not None or self.paths is not None


@dataclass(frozen=True, slots=True)
class RuleMatch:
    """The outcome of matching a rule list: the rule that matched, or why none did."""

    rule: CompiledRule | None
    reason: Reason
    # The rule that got furthest when none matched, for explain and audit.
    nearest: CompiledRule | None = None
    # The rule matched through `hosts: ["*"]`, not because it names the host.
    any_host: bool = False


# A sub-delimiter, ':' or '@' written in a glob matches its escape too: servers decode both alike.
_EITHER_SPELLING = {c: f"(?:{re.escape(c)}|%{ord(c):02X})" for c in "!$&'()+,=:@"}


def compile_path_globs(globs: Iterable[str], *, fold_case: bool = False) -> re.Pattern[str]:
    """One anchored regex for a list of globs: `*` within a segment, `**` across, `?` one char.

    A `/**` segment covers the path without it too: `/admin/**` matches `/admin`, `/a/**/b`
    matches `/a/b`. With `fold_case` (deny rules), letters match in either case, as a
    case-insensitive server (IIS, a case-folding framework) would read them.
    """
    parts = []
    for glob in globs:
        out = []
        i = 0
        while i < len(glob):
            if glob.startswith("/**", i) and glob[i + 3 : i + 4] in ("", "/"):
                out.append("(?:/.*)?")
                i += 3
            elif glob.startswith("**", i):
                out.append(".*")
                i += 2
            elif glob[i] == "*":
                out.append("[^/]*")
                i += 1
            elif glob[i] == "?":
                out.append("[^/]")
                i += 1
            else:
                out.append(_EITHER_SPELLING.get(glob[i]) or re.escape(glob[i]))
                i += 1
        parts.append("".join(out))
    flags = re.IGNORECASE | re.ASCII if fold_case else 0
    return re.compile("|".join(f"(?:{p})" for p in parts), flags)


class RuleIndex:
    """The rules of one list (a tenant's allow or deny), indexed for lookup by destination."""

    __slots__ = (
        "_any_host",
        "_any_port",
        "_cidr_rules",
        "_cidrs",
        "_exact",
        "_internal",
        "_internal_rules",
        "_ports",
        "_sectioned",
        "_suffix",
        "has_raw_tcp",
        "rules",
    )

    def __init__(self, rules: Iterable[CompiledRule], *, sections: bool = True) -> None:
        self.rules = tuple(rules)
        # The rules with a protocol section, indexed alike (None: there are none): a section
        # applies to every request to its hosts and ports (`section_rules`).
        self._sectioned = _section_index(self.rules) if sections else None
        exact: dict[str, list[CompiledRule]] = {}
        suffix: dict[str, list[CompiledRule]] = {}
        cidr_rules: list[tuple[CidrSet, CompiledRule]] = []
        internal_rules: list[tuple[CidrSet, CompiledRule]] = []
        for rule in self.rules:
            for host in rule.hosts:
                if host == ANY_HOST:
                    continue
                if host.startswith("*."):
                    suffix.setdefault(host[2:], []).append(rule)
                else:
                    exact.setdefault(host, []).append(rule)
            if rule.cidrs:
                cidr_rules.append((CidrSet(rule.cidrs), rule))
                # Only a cidr with no public address in it may open an internal one (the guard).
                inside = [n for n in map(parse_network, rule.cidrs) if internal_only(n)]
                if inside:
                    internal_rules.append((CidrSet(inside), rule))
        self._exact = {k: tuple(v) for k, v in exact.items()}
        self._suffix = {k: tuple(v) for k, v in suffix.items()}
        self._any_host = tuple(r for r in self.rules if ANY_HOST in r.hosts)
        self._cidr_rules = tuple(cidr_rules)
        self._cidrs = CidrSet(c for r in self.rules for c in r.cidrs)
        self._internal_rules = tuple(internal_rules)
        self._internal = CidrSet(n for nets, _ in internal_rules for n in nets)
        self._ports = frozenset(p for r in self.rules for p in r.ports)
        self._any_port = any(not r.ports for r in self.rules)
        self.has_raw_tcp = any(r.raw_tcp for r in self.rules)

    def candidates(
        self, host: str, ip: ipaddress.IPv4Address | ipaddress.IPv6Address | None
    ) -> Iterator[CompiledRule]:
        """Rules whose host or network part matches; `ip` is set when the host is an IP literal."""
        yield from self.named_candidates(host, ip)
        if ip is None and host:
            yield from self._any_host

    def named_candidates(
        self, host: str, ip: ipaddress.IPv4Address | ipaddress.IPv6Address | None
    ) -> Iterator[CompiledRule]:
        """Rules that name this host (exactly, by suffix) or its network; never `hosts: ["*"]`."""
        if ip is not None:
            if ip in self._cidrs:
                for networks, rule in self._cidr_rules:
                    if ip in networks:
                        yield rule
            return
        found = self._exact.get(host)
        if found:
            yield from found
        if not self._suffix:
            return
        dot = host.find(".")
        while dot != -1:
            found = self._suffix.get(host[dot + 1 :])
            if found:
                yield from found
            dot = host.find(".", dot + 1)

    def opens_internal(self, ip: ipaddress.IPv4Address | ipaddress.IPv6Address, port: int | None) -> bool:
        """Whether an internal-only cidr rule covers this address on `port` (None: on any port).

        What the tenant adds to the guard: the address is then reachable if, and only if, the
        operator lists it in `tenant_reachable` too. A broad cidr (`0.0.0.0/0`) never counts.
        """
        if ip not in self._internal:
            return False
        return any(ip in nets and (port is None or rule.port_ok(port)) for nets, rule in self._internal_rules)

    def match(
        self,
        host: str,
        ip: ipaddress.IPv4Address | ipaddress.IPv6Address | None,
        port: int,
        method: str | None,
        path: str | None,
        *,
        no_match: Reason,
        upgrade: str | None = None,
    ) -> RuleMatch:
        """The first rule matching every given part, else the most specific reason it failed.

        `method` and `path` are None before the HTTP layer: a rule that restricts them then
        matches on host and port alone, and is checked again per request. `upgrade` is the
        protocol switch a request asks for: only `websocket` on a `websocket: true` rule matches.
        """
        best = no_match
        nearest: CompiledRule | None = None
        named = self.named_candidates(host, ip)
        for any_host, rules in ((False, named), (True, self._any_host if ip is None and host else ())):
            for rule in rules:
                if not rule.port_ok(port):
                    if best is no_match:
                        best, nearest = Reason.PORT_NOT_ALLOWED, rule
                    continue
                if not rule.method_ok(method):
                    if best in (no_match, Reason.PORT_NOT_ALLOWED):
                        best, nearest = Reason.METHOD_NOT_ALLOWED, rule
                    continue
                if not rule.path_ok(path):
                    if best is not Reason.UPGRADE_NOT_ALLOWED:
                        best, nearest = Reason.PATH_NOT_ALLOWED, rule
                    continue
                if not rule.upgrade_ok(upgrade):
                    best, nearest = Reason.UPGRADE_NOT_ALLOWED, rule
                    continue
                return RuleMatch(rule, Reason.ALLOWED, any_host=any_host)
        return RuleMatch(None, best, nearest)

    def deny_match(
        self,
        host: str,
        ip: ipaddress.IPv4Address | ipaddress.IPv6Address | None,
        port: int,
        method: str | None,
        path: str | None,
    ) -> CompiledRule | None:
        """The first deny rule that matches fully; one restricting method or path needs both known."""
        for rule in self.candidates(host, ip):
            if rule.per_request and method is None:
                continue
            if rule.port_ok(port) and rule.method_ok(method) and rule.deny_path_hit(path):
                return rule
        return None

    def deny_address(
        self,
        ip: ipaddress.IPv4Address | ipaddress.IPv6Address,
        port: int,
        method: str | None,
        path: str | None,
    ) -> CompiledRule | None:
        """The first deny rule whose networks cover a resolved address (names resolve into them too)."""
        if ip not in self._cidrs:
            return None
        return self.deny_match("", ip, port, method, path)

    def allows_port(self, port: int) -> bool:
        """Whether any rule of this list could allow a connection to `port` (a cheap pre-check)."""
        return port in self._ports or self._any_port

    def names_host(self, host: str) -> bool:
        """Whether any rule names this host, whatever its ports, methods or paths (DNS answers)."""
        return next(self.candidates(host, None), None) is not None

    def denies_name(self, host: str) -> CompiledRule | None:
        """The first deny rule naming this host that refuses every request to it (no ports,
        methods or paths of its own): the gateway never looks such a name up."""
        for rule in self.candidates(host, None):
            if not rule.ports and rule.methods is None and rule.paths is None:
                return rule
        return None

    def names_explicitly(self, host: str) -> bool:
        """Whether a rule names this host itself (exactly or by suffix), not only `hosts: ["*"]`."""
        return next(self.named_candidates(host, None), None) is not None

    @property
    def has_sections(self) -> bool:
        """Whether any rule of this list has an `mcp:`, `jsonrpc:` or `graphql:` section."""
        return self._sectioned is not None

    def section_rules(
        self, host: str, ip: ipaddress.IPv4Address | ipaddress.IPv6Address | None, port: int
    ) -> tuple[CompiledRule, ...]:
        """One rule per distinct section among the rules whose hosts (`*` included) or networks
        and ports match, whatever their methods and paths: the sections that apply to every
        request to host:port (`host` "" and `ip`: a resolved address's networks only)."""
        if self._sectioned is None:
            return ()
        found: dict[int, CompiledRule] = {}
        for rule in self._sectioned.candidates(host, ip):
            if rule.port_ok(port):
                found.setdefault(id(rule.messages), rule)
        return tuple(found.values())

    def needs_inspection(
        self, host: str, ip: ipaddress.IPv4Address | ipaddress.IPv6Address | None, port: int
    ) -> bool:
        """Whether any rule for this destination can only be applied by intercepting TLS."""
        return any(
            rule.port_ok(port) and (rule.inspect or rule.per_request) for rule in self.candidates(host, ip)
        )


def _section_index(rules: tuple[CompiledRule, ...]) -> RuleIndex | None:
    """The rules with a section, each section that equals another one written elsewhere (a
    preset's in two places, the same text twice) replaced by the first: one object per content."""
    same: dict[str, McpSection | JsonRpcSection | GraphqlSection] = {}
    sectioned = []
    for rule in rules:
        if rule.messages is None:
            continue
        key = f"{type(rule.messages).__name__}:{rule.messages.model_dump_json()}"
        first = same.setdefault(key, rule.messages)
        sectioned.append(rule if first is rule.messages else replace(rule, messages=first))
    return RuleIndex(sectioned, sections=False) if sectioned else None
