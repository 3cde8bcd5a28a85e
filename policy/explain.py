"""Why a request is allowed or denied: each step of the evaluation order and what matched.

The steps are recomputed with the same matcher, guard, resolver and engine `decide` uses,
for display; the decision itself is `decide`'s, so an explanation never disagrees with the
gateway. Steps after the one that decided are shown as not reached.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field, replace
from typing import Any

from sandgate.policy.address_guard import AddressGuard
from sandgate.policy.decide import decide, literal_ip, pick_address
from sandgate.policy.decision import Decision, EgressRequest, Identity, Refusal
from sandgate.policy.errors import ResolveError
from sandgate.policy.matcher import CompiledRule
from sandgate.policy.model.policyset import PolicySet, TenantPolicy
from sandgate.policy.overrides import decide_readings
from sandgate.policy.reasons import Reason
from sandgate.policy.rego.engine import PolicyEngine, RegoQuery, RegoVerdict
from sandgate.policy.rego.input_document import input_document
from sandgate.policy.resolver import Resolver

__all__ = ["AddressCheck", "Explanation", "Step", "explain"]

STEP_NAMES = ("identity", "address guard", "deny rules", "allow rules", "resolve", "rego")


@dataclass(frozen=True, slots=True)
class AddressCheck:
    """One address the guard looked at (steps 2 and 5): `dial`, `refused` (with why) or
    `not checked` (after the one dialled)."""

    address: str
    result: str
    why: str = ""

    def as_dict(self) -> dict[str, str]:
        return {"address": self.address, "result": self.result, "why": self.why}


@dataclass(frozen=True, slots=True)
class Step:
    """One step of the evaluation order: what it found, and the rule when one matched."""

    number: int
    name: str
    outcome: str
    detail: str
    rule_id: str | None = None
    origin: str | None = None
    addresses: tuple[AddressCheck, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "step": self.number,
            "name": self.name,
            "outcome": self.outcome,
            "detail": self.detail,
            "rule_id": self.rule_id,
            "origin": self.origin,
        }
        if self.addresses:
            out["addresses"] = [a.as_dict() for a in self.addresses]
        return out


@dataclass(frozen=True, slots=True)
class Explanation:
    """The decision, the steps that led to it, and the Rego input and verdict when there is Rego."""

    decision: Decision
    steps: tuple[Step, ...]
    rego_input: dict[str, Any] | None = None
    rego_verdict: RegoVerdict | None = None
    rego_modules: tuple[str, ...] = field(default=())


async def explain(
    policy: PolicySet,
    identity: Identity | None,
    request: EgressRequest,
    resolver: Resolver,
    guard: AddressGuard,
    engine: PolicyEngine,
) -> Explanation:
    """Decide `request` with `decide`, and describe each step of the order on the way.

    A request that can mean other methods (sandgate.policy.overrides) is decided for each of
    them as the gateway does; when one is refused, that reading is the one explained.
    """
    explained = await _explain_one(policy, identity, request, resolver, guard, engine)
    if not explained.decision.allowed:
        return explained
    refused: list[EgressRequest] = []

    async def decide_one(who: Identity | None, req: EgressRequest, *, address: str | None = None) -> Decision:
        found = await decide(policy, who, req, resolver, guard, address=address, engine=engine)
        if not found.allowed:
            refused.append(req)
        return found

    decision = await decide_readings(decide_one, identity, request, explained.decision)
    if decision is explained.decision:
        return explained
    if refused:
        explained = await _explain_one(policy, identity, refused[0], resolver, guard, engine)
    return replace(explained, decision=decision)


async def _explain_one(
    policy: PolicySet,
    identity: Identity | None,
    request: EgressRequest,
    resolver: Resolver,
    guard: AddressGuard,
    engine: PolicyEngine,
) -> Explanation:
    decision = await decide(policy, identity, request, resolver, guard, engine=engine)
    steps: list[Step] = []
    tenant = policy.tenant(identity.tenant) if identity else None
    if identity is None or tenant is None:
        detail = "no sandbox identity" if identity is None else f"tenant {identity.tenant!r} is not defined"
        steps.append(Step(1, "identity", "deny", detail))
        return Explanation(decision, _pad(steps))
    steps.append(Step(1, "identity", "ok", f"sandbox {identity.sandbox} of tenant {tenant.name}"))
    ip = literal_ip(request.host)
    if ip is None:
        steps.append(
            Step(2, "address guard", "skip", f"{request.host} is a name: its addresses are checked in step 5")
        )
    else:
        refused = guard.check(ip, by_name=False, tenant_opens=tenant.allow.opens_internal(ip, request.port))
        if refused is not None:
            checked = (AddressCheck(refused.address, "refused", refused.why),)
            steps.append(Step(2, "address guard", "deny", refused.why, addresses=checked))
            return Explanation(decision, _pad(steps))
        dialled = (AddressCheck(str(ip), "dial"),)
        steps.append(Step(2, "address guard", "ok", f"{ip} may be dialled", addresses=dialled))
    named = _rule_steps(steps, tenant, request, ip, decision)
    if named is None:
        return Explanation(decision, _pad(steps))
    dial = await _resolve_step(steps, tenant, request, resolver, guard, ip, named)
    if dial is None:
        return Explanation(decision, _pad(steps))
    if tenant.rego is None:
        steps.append(Step(6, "rego", "skip", "the tenant has no Rego: the allowlist decides alone"))
        return Explanation(decision, tuple(steps))
    assert identity is not None
    document = input_document(identity, request, dial)
    verdict = await engine.evaluate(RegoQuery(tenant.rego, document))
    if verdict.allowed:
        outcome = "ok"
    elif verdict.fault:
        outcome = "error"
    else:
        outcome = "would deny" if decision.allowed else "deny"
    detail = verdict.reason.value + (f": {verdict.message}" if verdict.message else "")
    steps.append(Step(6, "rego", outcome, detail, rule_id=f"{tenant.name}/rego"))
    modules = tuple(m.path for m in tenant.rego.modules)
    return Explanation(decision, tuple(steps), document, verdict, modules)


def _rule_steps(
    steps: list[Step], tenant: TenantPolicy, request: EgressRequest, ip: Any, decision: Decision
) -> bool | None:
    """Steps 3 and 4; None when one of them denied (report mode relaxes: "would deny"), else
    whether an allow rule names the host itself (not only `hosts: ["*"]`)."""
    args = (request.host, ip, request.port, request.method, request.path)
    denied = "would deny" if decision.allowed else "deny"
    for index, whose in ((tenant.base_deny, "the operator's base"), (tenant.deny, "the tenant's")):
        rule = index.deny_match(*args)
        if rule is not None:
            steps.append(_rule_step(3, "deny rules", denied, f"{whose} deny rule matches", rule))
            return False if decision.allowed else None
    steps.append(Step(3, "deny rules", "ok", "no deny rule matches"))
    match = tenant.allow.match(*args, no_match=Reason.HOST_NOT_ALLOWED, upgrade=request.upgrade)
    if match.rule is not None:
        how = 'hosts: ["*"] matches (public addresses only)' if match.any_host else "an allow rule matches"
        steps.append(_rule_step(4, "allow rules", "ok", how, match.rule))
        return not match.any_host
    nearest = match.nearest
    if nearest is not None:
        steps.append(_rule_step(4, "allow rules", denied, f"{match.reason.value} (nearest rule)", nearest))
    else:
        steps.append(Step(4, "allow rules", denied, f"{match.reason.value}: no rule names this destination"))
    return tenant.allow.names_explicitly(request.host) if decision.allowed else None


async def _resolve_step(
    steps: list[Step],
    tenant: TenantPolicy,
    request: EgressRequest,
    resolver: Resolver,
    guard: AddressGuard,
    ip: Any,
    named: bool,
) -> str | None:
    """Step 5: the address that will be dialled, or None when resolution denied."""
    if ip is not None:
        steps.append(Step(5, "resolve", "skip", f"{ip} is an address"))
        return str(ip)
    try:
        choice = await pick_address(tenant, request, resolver, guard, None, public_only=not named)
    except ResolveError as e:
        steps.append(Step(5, "resolve", "deny", f"cannot resolve: {e}"))
        return None
    checked = _address_checks(choice.candidates, choice.refused, choice.dial)
    resolved = f"{request.host} → {', '.join(choice.candidates)}"
    if choice.dial is None:
        denial = choice.denial
        detail = f"{resolved}: {denial.reason.value}, no address may be dialled"
        steps.append(Step(5, "resolve", "deny", detail, rule_id=denial.rule_id, addresses=checked))
        return None
    detail = resolved if len(choice.candidates) == 1 else f"{resolved}: dials {choice.dial}"
    steps.append(Step(5, "resolve", "ok", detail, addresses=checked))
    return choice.dial


def _address_checks(
    candidates: tuple[str, ...], refused: tuple[Refusal, ...], dial: str | None
) -> tuple[AddressCheck, ...]:
    """Each resolved address in order: refused (why), dialled, or not checked after the dial.
    Every address before the dialled one was refused, in order (the first MAX_REFUSALS kept)."""
    dial_at = len(candidates)
    if dial is not None:
        dial_at = next((i for i, text in enumerate(candidates) if _canonical(text) == dial), dial_at)
    out: list[AddressCheck] = []
    for i, text in enumerate(candidates):
        if i < dial_at:
            why = refused[i].why if i < len(refused) else "refused (not kept: too many refusals)"
            out.append(AddressCheck(text, "refused", why))
        else:
            out.append(AddressCheck(text, "dial" if i == dial_at else "not checked"))
    return tuple(out)


def _canonical(text: str) -> str:
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        return text


def _rule_step(number: int, name: str, outcome: str, detail: str, rule: CompiledRule) -> Step:
    return Step(number, name, outcome, detail, rule_id=rule.rule_id, origin=rule.origin or None)


def _pad(steps: list[Step]) -> tuple[Step, ...]:
    """The steps taken, then the rest as not reached."""
    done = {s.number for s in steps}
    rest = [Step(i + 1, n, "not reached", "") for i, n in enumerate(STEP_NAMES) if i + 1 not in done]
    return (*steps, *rest)
