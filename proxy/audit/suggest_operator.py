"""`audit suggest` for `private_address` denials: what the gateway operator would have to open.

No tenant rule alone opens an internal address: the operator's `address_guard` must open it
(`tenant_reachable`, with a cidr rule of the tenant covering it too; or `reachable_by_name`
for a name a rule names). So these suggestions are operator-level: a gateway config snippet
plus the tenant's cidr rule, printed as comments, apart from the tenant's `allow:` list.
Addresses the guard never opens (the gateway's own, metadata, unspecified, multicast,
broadcast) get no suggestion, only why. The addresses come from the records' `refused`
list; an older record names one only when its destination was an address literal.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import yaml
from pydantic import ValidationError

from sandgate.policy.address_guard import NEVER_OPENED
from sandgate.policy.addresses import classify
from sandgate.policy.model.tenant import Rule
from sandgate.proxy.audit.format import clean
from sandgate.proxy.audit.query import Record, dest_host, record_time

__all__ = ["InternalAddresses"]

# Kinds no operator range opens (sandgate.policy.address_guard): the gateway's own addresses too.
NEVER = frozenset({*(c.value for c in NEVER_OPENED), "own", "invalid"})
_NEVER_WHY = {
    "own": "an address of the gateway itself: dialling it reaches the gateway host's services",
    "metadata": "a cloud metadata address: it hands out the host's credentials",
    "unspecified": "the unspecified address means this host",
    "multicast": "a multicast address reaches every host of a group",
    "broadcast": "the broadcast address reaches every host of the network",
    "invalid": "not an address",
}


@dataclass(slots=True)
class Refused:
    """The denials of one refused address."""

    address: str
    kind: str
    count: int = 0
    ports: set[int] = field(default_factory=set)
    names: set[str] = field(default_factory=set)
    first: datetime | None = None
    last: datetime | None = None


@dataclass(slots=True)
class InternalAddresses:
    """A sandbox's private_address denials, by refused address."""

    by_address: dict[str, Refused] = field(default_factory=dict)
    unnamed: int = 0

    def add(self, record: Record) -> None:
        """Count one private_address denial under each address it refused."""
        dest = record.get("dest")
        port = dest.get("port") if isinstance(dest, dict) else None
        host = dest_host(record)
        found = _refused_of(record, host)
        if not found:
            self.unnamed += 1
            return
        moment = record_time(record)
        for address, kind in found:
            group = self.by_address.setdefault(address, Refused(address, kind))
            group.count += 1
            if isinstance(port, int):
                group.ports.add(port)
            if host and host.strip("[]") != address:
                group.names.add(host)
            if moment is not None:
                group.first = moment if group.first is None else min(group.first, moment)
                group.last = moment if group.last is None else max(group.last, moment)

    def lines(self, tenant: str | None, min_count: int) -> list[str]:
        """The operator-level section, as comment lines (empty when there is nothing to say)."""
        groups = sorted(self.by_address.values(), key=lambda g: (-g.count, g.address))
        never = [g for g in groups if g.kind in NEVER]
        few = [g for g in groups if g.kind not in NEVER and g.count < min_count]
        openable = [g for g in groups if g.kind not in NEVER and g.count >= min_count]
        out: list[str] = []
        if openable:
            out += _operator_lines(openable, tenant)
        if never or few or self.unnamed:
            out.append("# Not suggested (private_address):")
        for g in never:
            why = _NEVER_WHY.get(g.kind, "never reachable")
            out.append(f"#   {clean(g.address)} ({clean(g.kind)}, {g.count} denial(s){_names(g)}): "
                       f"never reachable, no operator range opens it ({why})")  # fmt: skip
        for g in few:
            out.append(f"#   {clean(g.address)}: {g.count} denial(s), fewer than --min-count {min_count}")
        if self.unnamed:
            out.append(
                f"#   {self.unnamed} denials whose records name no refused address (recorded before "
                "records carried `refused`): `sandgate policy explain` shows them"
            )
        return out


def _refused_of(record: Record, host: str | None) -> list[tuple[str, str]]:
    """(address, kind) for each address the guard refused in this record."""
    listed = record.get("refused")
    if isinstance(listed, list):
        out = []
        for entry in listed:
            if not isinstance(entry, dict):
                continue
            address, kind = entry.get("address"), entry.get("kind")
            if isinstance(address, str) and isinstance(kind, str) and kind != "deny_rule":
                out.append((address, kind))
        return out
    try:
        ip = ipaddress.ip_address((host or "").strip("[]"))
    except ValueError:
        return []
    return [(str(ip), classify(ip).value)]


def _names(group: Refused) -> str:
    return f", as {', '.join(clean(n) for n in sorted(group.names))}" if group.names else ""


def _network(address: str) -> str:
    return str(ipaddress.ip_network(address))


def time_span(first: datetime | None, last: datetime | None) -> str:
    """`first .. last` times of a group of denials, to the second."""
    if first is None or last is None:
        return "time unknown"
    a, b = (t.strftime("%Y-%m-%dT%H:%M:%SZ") for t in (first, last))
    return a if a == b else f"{a} .. {b}"


def _tenant_rule(group: Refused) -> dict[str, Any] | None:
    """The tenant's cidr rule for one address, checked with the policy's own model."""
    rule: dict[str, Any] = {
        "id": "suggested-" + "".join(c if c.isalnum() or c in "._-" else "-" for c in group.address),
        "cidrs": [_network(group.address)],
    }
    if group.ports:
        rule["ports"] = sorted(group.ports)
    rule["comment"] = (
        f"{group.count} private_address denials{_names(group)}, {time_span(group.first, group.last)}"
    )
    try:
        Rule.model_validate(rule)
    except ValidationError:
        return None
    return rule


def _yaml_comment(value: Any, indent: str) -> list[str]:
    text = yaml.safe_dump(value, sort_keys=False, default_flow_style=None, width=1 << 16)
    return [f"#{indent}{line}" for line in text.rstrip("\n").splitlines()]


def _operator_lines(groups: list[Refused], tenant: str | None) -> list[str]:
    rules = [r for r in (_tenant_rule(g) for g in groups) if r is not None]
    networks = [_network(g.address) for g in groups]
    where = f"tenant {clean(tenant)}'s file" if tenant else "the tenant's file"
    out = [
        "# OPERATOR-LEVEL (needs the gateway config, not only the tenant file): the address guard",
        "# refused these internal addresses (private_address). No tenant rule opens them alone;",
        "# opening them takes both changes below. Open only what the sandbox must reach.",
        "#   1. in the gateway config (sandgate.yaml; read at start: restart the gateway), merged with",
        "#      any address_guard.tenant_reachable it has:",
        *_yaml_comment({"address_guard": {"tenant_reachable": networks}}, "        "),
        f"#   2. in {where}, under `allow:`:",
        *_yaml_comment(rules, "        "),
    ]
    named = sorted({n for g in groups for n in g.names})
    if named:
        out += [
            f"#   Or, to reach {', '.join(clean(n) for n in named)} by name only (never by raw address): add",
            "#   the addresses to address_guard.reachable_by_name instead, and keep a rule naming the host.",
        ]
    return out
