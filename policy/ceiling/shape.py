"""What the prover compares: a rule's (or a ceiling region's) hosts, networks, ports, methods
and paths, as written. No I/O."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sandgate.policy.ceiling.sets import ALL_PORTS, Intervals

__all__ = ["RuleShape", "ports_of"]


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
