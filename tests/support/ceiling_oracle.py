"""The oracle for the prover's tests: the gateway's own matching (RuleIndex, compile_path_globs,
normalise_host, read_target), never the prover's set logic."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

from sandgate.policy.ceiling import RAW_TCP, CounterExample, RuleShape
from sandgate.policy.hosts import normalise_host
from sandgate.policy.matcher import CompiledRule, RuleIndex, compile_path_globs
from sandgate.policy.paths import read_target
from sandgate.policy.reasons import Reason


def _compiled(shape: RuleShape, i: int) -> CompiledRule:
    """The rule as policy/model/loader.py compiles it (deny globs fold case)."""
    ports: set[int] = set()
    if shape.ports.spans != ((1, 65535),):
        for lo, hi in shape.ports.spans:
            ports.update(range(lo, hi + 1))
    return CompiledRule(
        rule_id=f"r{i}",
        ports=frozenset(ports),
        methods=shape.methods,
        paths=compile_path_globs(shape.paths, fold_case=shape.deny) if shape.paths is not None else None,
        inspect=bool(shape.methods or shape.paths),
        hosts=shape.hosts,
        cidrs=shape.cidrs,
        raw_tcp=shape.raw_tcp,
    )


class GatewayMatcher:
    """The gateway's matcher over a list of rules, built once; `allows` per concrete request.

    `region`: ceiling semantics for raw TCP (only a region without methods and paths allows it).
    Shapes with `deny` are deny rules: a request they refuse counts as allowed here (what is
    taken away from a tenant's rules is covered).
    """

    def __init__(self, rules: Sequence[RuleShape], *, region: bool) -> None:
        allow = [r for r in rules if not r.deny]
        if region:
            raw = [r for r in allow if r.methods is None and r.paths is None]
        else:
            raw = [r for r in allow if r.raw_tcp]
        self._raw = RuleIndex(_compiled(r, i) for i, r in enumerate(raw))
        self._http = RuleIndex(_compiled(r, i) for i, r in enumerate(allow))
        self._deny = RuleIndex(_compiled(r, i) for i, r in enumerate(rules) if r.deny)

    def allows(self, request: CounterExample) -> bool:
        host = normalise_host(request.host)
        try:
            ip: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.ip_address(host)
        except ValueError:
            ip = None
        if request.method == RAW_TCP:
            if self._deny.deny_match(host, ip, request.port, None, None) is not None:
                return True
            found = self._raw.match(host, ip, request.port, None, None, no_match=Reason.HOST_NOT_ALLOWED)
            return found.rule is not None
        assert request.path is not None
        path = read_target(request.path).path
        if self._deny.deny_match(host, ip, request.port, request.method, path) is not None:
            return True
        found = self._http.match(
            host, ip, request.port, request.method, path, no_match=Reason.HOST_NOT_ALLOWED
        )
        return found.rule is not None


def gateway_allows(rules: Sequence[RuleShape], request: CounterExample, *, region: bool) -> bool:
    """Whether the gateway's matcher lets a concrete request through these rules."""
    return GatewayMatcher(rules, region=region).allows(request)


def readable(path: str) -> bool:
    """Whether the gateway reads the path as written (its normal form)."""
    return read_target(path).path == path
