"""What tenant rules can never reach through the address guard: `policy check` notes. No I/O.

A tenant writes `cidrs: [0.0.0.0/0]` to mean "the internet", or `10.1.5.0/24` for a lab the
operator has not opened; neither is an error (the guard simply holds), but the author should
know which addresses the rule will never reach, and that `hosts: ["*"]` is as wide as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from ipaddress import IPv4Network, IPv6Network

from sandgate.policy.address_guard import NEVER_OPENED
from sandgate.policy.addresses import GUARDED_RANGES, CidrSet, internal_only, parse_network
from sandgate.policy.matcher import ANY_HOST, CompiledRule
from sandgate.policy.model.policyset import PolicySet

__all__ = ["Note", "reach_notes"]


@dataclass(frozen=True, slots=True)
class Note:
    """One finding about a rule: `warning` (it cannot do all it says) or `note` (it is wide)."""

    level: str
    origin: str
    rule_id: str
    text: str

    def __str__(self) -> str:
        return f"{self.origin}: {self.level}: {self.rule_id}: {self.text}"


def reach_notes(policy: PolicySet, tenant_reachable: CidrSet | None = None) -> list[Note]:
    """Notes on every allow rule of every tenant (a preset's rules once).

    `tenant_reachable`: the operator's ranges (from the gateway config), or None when unknown.
    """
    seen: set[str] = set()
    notes: list[Note] = []
    for name in sorted(policy.tenants):
        for rule in policy.tenants[name].allow.rules:
            if rule.rule_id in seen:
                continue
            seen.add(rule.rule_id)
            notes += _rule_notes(rule, tenant_reachable)
    return notes


def _rule_notes(rule: CompiledRule, tenant_reachable: CidrSet | None) -> list[Note]:
    found: list[Note] = []

    def add(level: str, text: str) -> None:
        found.append(Note(level, rule.origin or "-", rule.rule_id, text))

    if ANY_HOST in rule.hosts:
        add(
            "note",
            "hosts ['*'] allows any name the gateway resolves to a public address on this rule's ports "
            "(never an IP literal, never a private range; deny rules still apply), and lets the "
            "guest have any name looked up by the gateway's resolver",
        )
    for text in rule.cidrs:
        network = parse_network(text)
        classes = _guarded_classes(network)
        if not classes:
            continue
        if not internal_only(network):
            add(
                "warning",
                f"{text} reaches public addresses only: the {', '.join(classes)} addresses in it are "
                "never reachable through a broad rule (name a private range the operator opens instead)",
            )
            continue
        never = _guarded_classes(network, only_never=True)
        if never:
            add("warning", f"{text} holds {', '.join(never)} addresses: never reachable")
        if tenant_reachable is None:
            add(
                "warning",
                f"{text} is not public: reachable only inside the gateway's "
                "address_guard.tenant_reachable (check with --config)",
            )
        elif not tenant_reachable.holds(network):
            add(
                "warning",
                f"{text} is not wholly inside address_guard.tenant_reachable: the rest is never reachable",
            )
    return found


def _guarded_classes(network: IPv4Network | IPv6Network, *, only_never: bool = False) -> list[str]:
    """Names of the non-public classes whose ranges overlap `network`, in table order."""
    names: list[str] = []
    for address_class, guarded in GUARDED_RANGES:
        if guarded.version != network.version or not guarded.overlaps(network):
            continue
        if only_never and address_class not in NEVER_OPENED:
            continue
        if address_class.value not in names:
            names.append(address_class.value)
    return names
