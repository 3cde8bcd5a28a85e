"""What the prover compares: a rule's (or a ceiling region's) hosts, networks, ports, methods
and paths, as written. No I/O."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated

from pydantic import AfterValidator

from sandgate.policy.ceiling.sets import ALL_PORTS, Intervals
from sandgate.policy.model.tenant import Rule

if TYPE_CHECKING:
    from sandgate.policy.protocols.rules import GraphqlSection, JsonRpcSection, McpSection

__all__ = ["ALLOW_DEFAULT_PORTS", "PortOrRange", "RuleShape", "port_span", "ports_of"]

# What an allow rule without `ports` allows (policy/model/loader.py DEFAULT_ALLOW_PORTS).
ALLOW_DEFAULT_PORTS = (443,)


_RANGE = re.compile(r"^([0-9]{1,5})-([0-9]{1,5})$")


def port_span(value: int | str) -> tuple[int, int]:
    """The (low, high) ports of a port (1..65535) or a `low-high` range of them."""
    if isinstance(value, int):
        if not 1 <= value <= 65535:
            raise ValueError(f"port {value} is out of range 1..65535")
        return value, value
    m = _RANGE.match(value)
    if m is None:
        raise ValueError(f"{value!r}: a port is a number or a range 'low-high'")
    low, high = int(m[1]), int(m[2])
    if not 1 <= low <= high <= 65535:
        raise ValueError(f"{value!r}: a range needs 1 <= low <= high <= 65535")
    return low, high


def _check_port(value: int | str) -> int | str:
    port_span(value)
    return value


PortOrRange = Annotated[int | str, AfterValidator(_check_port)]


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
    # An allow rule's `mcp:`, `jsonrpc:` or `graphql:` section (sandgate.policy.ceiling.sections).
    messages: McpSection | JsonRpcSection | GraphqlSection | None = field(default=None, compare=False)

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
            messages=rule.messages,
        )
