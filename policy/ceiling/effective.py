"""Each tenant's effective allow rules and the deny rules that take from them, read as the
gateway loads them, with their globs.

The compiled rules (policy/model/loader.py) keep path globs only as a regex; the prover needs
them as written, so the tenant, preset and base files are read again (they have just loaded)
and each rule is paired with its compiled one, in the gateway's order: the tenant's own
allow rules, then each included preset's, then the grants of its grants file that have not
expired (a grant is an allow rule an approval added; its paths are globs as written, so an
exact path is read as itself); its deny rules; the operator's base deny rules. Grants a
running gateway keeps for one sandbox, or in redis, are not in the files and not proved.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sandgate.policy.ceiling.shape import RuleShape, ports_of
from sandgate.policy.decision import Mode
from sandgate.policy.matcher import CompiledRule
from sandgate.policy.model.grants import Grant
from sandgate.policy.model.policyset import PolicySet, TenantPolicy
from sandgate.policy.model.tenant import BaseFile, PresetFile, Rule, TenantFile
from sandgate.policy.model.yamlsource import load_yaml, validate

__all__ = ["TenantRules", "effective_rules"]


@dataclass(frozen=True, slots=True)
class TenantRules:
    """One tenant's allow rules, what is taken from them, and what else decides."""

    tenant: str
    source: str
    rules: tuple[RuleShape, ...]
    # Deny rules that bind this tenant: the operator's base ones and, unless in report
    # mode (which relaxes them for names), its own.
    denies: tuple[RuleShape, ...] = ()
    # `mode: report` allows what the rules would deny (recorded as would_deny): where it is set.
    report_mode: str | None = None
    # Rego can only refuse what the rules allow (data.sandgate.decision must allow too).
    has_rego: bool = False


def effective_rules(policy: PolicySet, now: float | None = None) -> list[TenantRules]:
    """Every tenant of a strictly loaded policy, by name (grants live at `now`, default: now)."""
    presets: dict[str, PresetFile] = {}
    base: list[Rule] = []
    for file in policy.files:
        path = Path(file)
        if path.parent.name == "presets":
            model = validate(PresetFile, load_yaml(path))
            presets[model.preset] = model
        elif path.name == "base.yaml" and path.parent.name != "tenants":
            base = list(validate(BaseFile, load_yaml(path)).deny)
    at = time.time() if now is None else now
    return [_tenant(policy.tenants[name], presets, base, at) for name in sorted(policy.tenants)]


def _tenant(
    tenant: TenantPolicy, presets: dict[str, PresetFile], base: list[Rule], now: float
) -> TenantRules:
    doc = load_yaml(Path(tenant.source))
    model = validate(TenantFile, doc)
    written: list[Rule] = list(model.allow)
    for name in model.include:
        written += presets[name].allow
    report = None
    if tenant.mode is Mode.REPORT:
        where = doc.locate(("mode",))
        report = f"{where.file}:{where.line}"
    denies = _pair(tenant.base_deny.rules, base, deny=True)
    if report is None:
        denies += _pair(tenant.deny.rules, model.deny, deny=True)
    return TenantRules(
        tenant.name,
        tenant.source,
        _pair(tenant.allow.rules, written, deny=False)
        + tuple(_grant_shape(g) for g in tenant.grants if g.live(now)),
        denies=denies,
        report_mode=report,
        has_rego=tenant.rego is not None,
    )


def _pair(compiled: Sequence[CompiledRule], written: Sequence[Rule], *, deny: bool) -> tuple[RuleShape, ...]:
    if len(compiled) != len(written):
        raise RuntimeError(f"{len(compiled)} compiled rules, {len(written)} written")
    return tuple(_shape(c, w, deny) for c, w in zip(compiled, written, strict=True))


def _shape(compiled: CompiledRule, written: Rule, deny: bool) -> RuleShape:
    """The compiled rule's hosts, ports and methods (defaults applied) with the globs as written."""
    if compiled.hosts != tuple(written.hosts) or compiled.cidrs != tuple(written.cidrs):
        raise RuntimeError(f"{compiled.rule_id}: the written rule does not match the compiled one")
    return RuleShape(
        hosts=compiled.hosts,
        cidrs=compiled.cidrs,
        ports=ports_of(sorted(compiled.ports)),
        methods=compiled.methods,
        paths=tuple(written.paths) if written.paths is not None else None,
        raw_tcp=compiled.raw_tcp,
        rule_id=compiled.rule_id,
        origin=compiled.origin,
        deny=deny,
        messages=written.messages,
    )


def _grant_shape(grant: Grant) -> RuleShape:
    """A grant as the allow rule it is: one host (or address), one port."""
    rule = grant.rule
    return RuleShape(
        hosts=rule.hosts,
        cidrs=rule.cidrs,
        ports=ports_of([grant.port]),
        methods=rule.methods,
        paths=grant.paths,
        rule_id=rule.rule_id,
        origin=rule.origin,
    )
