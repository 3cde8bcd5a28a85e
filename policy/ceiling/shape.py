"""What the prover compares: a rule's (or a ceiling region's) hosts, networks, ports, methods
and paths, as written. No I/O."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sandgate.policy.ceiling.sets import ALL_PORTS, Intervals
from sandgate.policy.model.tenant import Rule

__all__ = ["ALLOW_DEFAULT_PORTS", "RuleShape", "ports_of"]

# What an allow rule without `ports` allows (policy/model/loader.py DEFAULT_ALLOW_PORTS).
ALLOW_DEFAULT_PORTS = (443,)


def ports_of(ports: Iterable[int | tuple[int, int]] | None) -> Intervals:
    """The ports of a list of ports and (low, high) ranges; None or empty: every port."""
    spans = [(p, p) if isinstance(p, int) else p for p in ports or ()]
    return Intervals.of(spans) if spans else ALL_PORTS


@dataclass(frozen=True, slots=True)
class RuleShape:
    """One allow rule or ceiling region: what requests it lets through.

    `hosts` are patterns (`name`, `*.suffix`, `*`), `cidrs` networks in normal form; `ports`
    as intervals (a tenant rule without ports has [443] by then); `methods` None for every
    method, `paths` None for every path. `raw_tcp`: a `protocol: tcp` rule, which passes bytes
    that are no HTTP request at all. `origin` is `file:line`, `rule_id` as the gateway names it.
    """

    hosts: tuple[str, ...] = ()
    cidrs: tuple[str, ...] = ()
    ports: Intervals = ALL_PORTS
    methods: frozenset[str] | None = None
    paths: tuple[str, ...] | None = None
    raw_tcp: bool = False
    rule_id: str = ""
    origin: str = ""
    # A deny rule, as something taken away: its globs fold case and take unreadable paths.
    deny: bool = False

    @staticmethod
    def from_rule(rule: Rule, rule_id: str = "", origin: str = "") -> RuleShape:
        """An allow rule as written in a tenant file (or proposed): ports default to [443]."""
        return RuleShape(
            hosts=tuple(rule.hosts),
            cidrs=tuple(rule.cidrs),
            ports=ports_of(rule.ports or ALLOW_DEFAULT_PORTS),
            methods=frozenset(rule.methods) if rule.methods is not None else None,
            paths=tuple(rule.paths) if rule.paths is not None else None,
            raw_tcp=rule.protocol == "tcp",
            rule_id=rule_id or (f"proposal/{rule.id}" if rule.id else "proposal"),
            origin=origin,
        )
