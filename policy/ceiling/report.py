"""`policy prove`: every tenant's effective allow rules against a ceiling, as a list of excesses.

What a tenant may reach is its allow rules (its own and its presets'), minus its deny rules
and the operator's base deny rules, taken away exactly (as extra regions whose globs fold
case and take the paths the gateway cannot read). Deny networks that a name resolves into
are not taken from names (no DNS here): conservative, never unsound.
Rego can only refuse what the rules allow, so a Rego tenant is proved on its rules. A tenant
in report mode allows what its rules would deny: it is checked as if it allowed everything.
The ceiling's `protocols:` entries are proved on the tenants' protocol sections
(sandgate.policy.ceiling.sections); a report-mode tenant lets what a section refuses through,
so it is found under every entry. No I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sandgate.policy.ceiling.effective import TenantRules
from sandgate.policy.ceiling.model import Ceiling
from sandgate.policy.ceiling.pathlang import ProofTooLarge
from sandgate.policy.ceiling.prove import CounterExample, excess, lookup_excess
from sandgate.policy.ceiling.sections import section_findings
from sandgate.policy.ceiling.sets import ALL_PORTS
from sandgate.policy.ceiling.shape import RuleShape
from sandgate.policy.matcher import ANY_HOST

__all__ = ["Excess", "Proof", "prove_tenants"]

# What a report-mode tenant may reach: any name, any address (the guard still holds).
_EVERYTHING = RuleShape(hosts=(ANY_HOST,), cidrs=("0.0.0.0/0", "::/0"), ports=ALL_PORTS, raw_tcp=True)


@dataclass(frozen=True, slots=True)
class Excess:
    """A rule that allows a request outside the ceiling (or that could not be decided)."""

    tenant: str
    rule_id: str
    origin: str
    example: CounterExample | None
    why: str = ""
    # A name the gateway would look up for this rule that no region names (its requests
    # being all denied); None with no example: not decided.
    lookup: str | None = None
    # A protocol message its section allows that a `protocols` entry denies (`tool 'delete_x'`).
    message: str | None = None

    def as_dict(self) -> dict[str, object]:
        return {
            "tenant": self.tenant,
            "rule_id": self.rule_id,
            "origin": self.origin,
            "request": self.example.as_dict() if self.example is not None else None,
            "lookup": self.lookup,
            "message": self.message,
            "why": self.why,
        }


@dataclass(frozen=True, slots=True)
class Proof:
    """The outcome: inside when there is no excess."""

    ceiling: str
    tenants: int
    rules: int
    excesses: tuple[Excess, ...]
    notes: tuple[str, ...] = field(default=())

    @property
    def inside(self) -> bool:
        return not self.excesses

    def as_dict(self) -> dict[str, object]:
        return {
            "ok": self.inside,
            "ceiling": self.ceiling,
            "tenants": self.tenants,
            "rules": self.rules,
            "excesses": [e.as_dict() for e in self.excesses],
            "notes": list(self.notes),
        }


def prove_tenants(tenants: list[TenantRules], ceiling: Ceiling) -> Proof:
    """Check each tenant's rules, less its deny rules, against the ceiling's regions."""
    found: list[Excess] = []
    notes: list[str] = []
    count = 0
    for t in tenants:
        cover = (*ceiling.regions, *t.denies)
        if t.has_rego:
            notes.append(f"tenant {t.tenant}: Rego can only refuse what its rules allow: proved on the rules")
        if t.report_mode is not None:
            found += _check(
                t.tenant, _report(t), cover, ceiling.regions, "report mode allows what the rules would deny"
            )
        for rule in t.rules:
            count += 1
            found += _check(t.tenant, rule, cover, ceiling.regions, "")
        found += _sections(t, ceiling)
    return Proof(ceiling.file, len(tenants), count, tuple(found), tuple(notes))


def _sections(t: TenantRules, ceiling: Ceiling) -> list[Excess]:
    """What the tenant's protocol sections (or their absence) let past the `protocols` entries."""
    found: list[Excess] = []
    for entry in ceiling.protocols:
        where = f"the ceiling's {entry.shape.rule_id} ({entry.shape.origin})"
        if t.report_mode is not None:
            why = f"report mode lets through what a protocol section refuses (recorded would_deny); {where}"
            found.append(Excess(t.tenant, f"{t.tenant}/mode", t.report_mode, None, why))
        try:
            findings = section_findings(t.rules, t.denies, entry)
        except Exception as e:  # ProofTooLarge, GlobTooLarge or other: never "inside" for want of an answer
            found.append(
                Excess(t.tenant, f"{t.tenant}/allow", t.source, None, f"not decided: {e!r} ({where})")
            )
            continue
        found += [
            Excess(t.tenant, f.rule.rule_id, f.rule.origin, f.example, f.why, message=f.message)
            for f in findings
        ]
    return found


def _report(t: TenantRules) -> RuleShape:
    return RuleShape(
        hosts=_EVERYTHING.hosts,
        cidrs=_EVERYTHING.cidrs,
        raw_tcp=True,
        rule_id=f"{t.tenant}/mode",
        origin=t.report_mode or t.source,
    )


def _check(
    tenant: str, rule: RuleShape, cover: tuple[RuleShape, ...], regions: tuple[RuleShape, ...], why: str
) -> list[Excess]:
    try:
        example = excess(rule, cover)
        name = lookup_excess(rule, regions) if example is None else None
    except ProofTooLarge as e:
        return [Excess(tenant, rule.rule_id, rule.origin, None, f"not decided: {e}")]
    except Exception as e:  # never "inside" for want of an answer
        return [Excess(tenant, rule.rule_id, rule.origin, None, f"not decided: {type(e).__name__}")]
    if example is None and name is not None:
        why = (
            "deny rules refuse its requests, but the gateway still looks up the names an allow "
            "rule names (its DNS listener answers them; a deny rule with methods or paths does "
            "not apply at CONNECT), and a lookup reaches that name's nameservers"
        )
        return [Excess(tenant, rule.rule_id, rule.origin, None, why, lookup=name)]
    if example is None:
        return []
    if example.unreadable_path or example.asterisk:
        why = why or (
            "a rule without paths also allows paths no allow glob matches (ones the gateway "
            "cannot read unambiguously, forwarded as sent; the `*` target); a region with paths "
            "does not: leave `paths` out of the region"
        )
    return [Excess(tenant, rule.rule_id, rule.origin, example, why)]
