"""Each tenant's effective allow rules, read as the gateway loads them, with their globs.

The compiled rules (policy/model/loader.py) keep path globs only as a regex; the prover needs
them as written, so the tenant and preset files are read again (they have just loaded) and
each rule is paired with its compiled one, in the gateway's order: the tenant's own, then
each included preset's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sandgate.policy.ceiling.shape import RuleShape, ports_of
from sandgate.policy.decision import Mode
from sandgate.policy.matcher import CompiledRule
from sandgate.policy.model.policyset import PolicySet, TenantPolicy
from sandgate.policy.model.tenant import PresetFile, Rule, TenantFile
from sandgate.policy.model.yamlsource import load_yaml, validate

__all__ = ["TenantRules", "effective_rules"]


@dataclass(frozen=True, slots=True)
class TenantRules:
    """One tenant's allow rules, and what else decides what it may reach."""

    tenant: str
    source: str
    rules: tuple[RuleShape, ...]
    # `mode: report` allows what the rules would deny (recorded as would_deny): where it is set.
    report_mode: str | None = None
    # Rego can only refuse what the rules allow (data.sandgate.decision must allow too).
    has_rego: bool = False
    has_deny: bool = False


def effective_rules(policy: PolicySet) -> list[TenantRules]:
    """Every tenant of a strictly loaded policy, by name."""
    presets = _presets(policy)
    return [_tenant(policy.tenants[name], presets) for name in sorted(policy.tenants)]


def _presets(policy: PolicySet) -> dict[str, tuple[str, PresetFile]]:
    out: dict[str, tuple[str, PresetFile]] = {}
    for file in policy.files:
        if Path(file).parent.name == "presets":
            model = validate(PresetFile, load_yaml(Path(file)))
            out[model.preset] = (file, model)
    return out


def _tenant(tenant: TenantPolicy, presets: dict[str, tuple[str, PresetFile]]) -> TenantRules:
    doc = load_yaml(Path(tenant.source))
    model = validate(TenantFile, doc)
    written: list[Rule] = list(model.allow)
    for name in model.include:
        written += presets[name][1].allow
    compiled = tenant.allow.rules
    if len(compiled) != len(written):
        raise RuntimeError(f"tenant {tenant.name}: {len(compiled)} compiled rules, {len(written)} written")
    rules = tuple(_shape(c, w) for c, w in zip(compiled, written, strict=True))
    report = None
    if tenant.mode is Mode.REPORT:
        where = doc.locate(("mode",))
        report = f"{where.file}:{where.line}"
    return TenantRules(
        tenant.name,
        tenant.source,
        rules,
        report_mode=report,
        has_rego=tenant.rego is not None,
        has_deny=bool(tenant.deny.rules or tenant.base_deny.rules),
    )


def _shape(compiled: CompiledRule, written: Rule) -> RuleShape:
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
    )
