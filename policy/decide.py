"""The evaluation order, written once. Every other module asks this one."""

from __future__ import annotations

import functools
import ipaddress
import time
from dataclasses import dataclass, replace

from sandgate.policy.address_guard import AddressGuard, IPAddress
from sandgate.policy.decision import (
    RELAXABLE_IN_REPORT_MODE,
    Decision,
    EgressRequest,
    Identity,
    Mode,
    Refusal,
)
from sandgate.policy.errors import ResolveError
from sandgate.policy.matcher import RuleMatch
from sandgate.policy.model.grants import Grant, Grants
from sandgate.policy.model.policyset import PolicySet, TenantPolicy
from sandgate.policy.reasons import Reason
from sandgate.policy.rego.engine import make_engine
from sandgate.policy.rego.input_document import input_document
from sandgate.policy.rego.protocol import PolicyEngine, RegoQuery, RegoVerdict, fault
from sandgate.policy.resolver import Resolver
from sandgate.policy.trace import AddressCheck, Outcome, RegoTrace, Step, StepName, Trace, address_checks

__all__ = ["AddressChoice", "decide", "default_engine", "guard_answers", "literal_ip", "pick_address"]

# Refusals kept per decision (a name can resolve to hundreds of addresses): the first ones.
MAX_REFUSALS = 16

_default_engine: PolicyEngine | None = None


def default_engine() -> PolicyEngine:
    """The engine `decide` uses when none is passed: embedded, with a decision cache."""
    global _default_engine
    if _default_engine is None:
        _default_engine = make_engine("embedded")
    return _default_engine


async def decide(
    policy: PolicySet,
    identity: Identity | None,
    request: EgressRequest,
    resolver: Resolver,
    guard: AddressGuard,
    *,
    address: str | None = None,
    engine: PolicyEngine | None = None,
    trace: Trace | None = None,
    grants: Grants | None = None,
) -> Decision:
    """Decide one request. The order, and the reason each step denies with:

    1. identity: no sandbox, or its tenant is gone                      → no_identity
    2. an IP-literal destination: the address guard                     → private_address
    3. tenant deny rules, the operator's base deny rules among them     → host_denied
    4. tenant allow rules (`hosts: ["*"]` last, and never for an
       IP literal), then the grants approvals added (the tenant's
       grants file, and `grants`: the gateway's sandbox and fleet
       grants), live ones only                                          → host_not_allowed,
                                                                          port_not_allowed,
                                                                          method_not_allowed,
                                                                          path_not_allowed,
                                                                          upgrade_not_allowed
    5. a name: resolve it with the gateway's resolver, keep the first
       address no deny network covers and the guard permits, and pin
       it for dialling                                                  → dns_failure,
                                                                          host_denied,
                                                                          private_address
    6. Rego, for a tenant with `rego:` or `data:`: data.sandgate.decision
       must allow too (the input document carries the address of step 5) → policy_denied or
       the code the policy names; an engine fault                        → policy_error
    In report mode, denials by the tenant's own rules in steps 3, 4 and 6 allow and are
    recorded as would-deny; the operator's base rules, deny networks, the address guard and
    policy_error always hold.

    The address guard (steps 2 and 5, policy/address_guard.py) is the operator's: the gateway's own
    addresses, unspecified, multicast, broadcast and metadata addresses are never dialled;
    other non-public addresses only inside ranges the operator opens (`tenant_reachable`
    when an internal-only tenant cidr rule covers the address too; `reachable_by_name` for
    a name a rule names explicitly). A tenant rule alone never opens one: `0.0.0.0/0` and
    `hosts: ["*"]` reach public addresses only, and report mode relaxes nothing here.

    Names are resolved only after the rules allow them (step 5 after 3–4), so the gateway
    never looks up a name a tenant may not reach: its resolver is no DNS exfiltration channel
    (except for a tenant that allows `hosts: ["*"]`, which lets any name be looked up).
    `address` is the address already pinned for this connection (per-request decisions
    inside an approved tunnel); it is re-checked, not re-resolved.

    `trace`: when given, each step taken is recorded in it (`policy explain`); the steps not
    taken are the ones after the step that decided.
    """
    if identity is None:
        if trace is not None:
            trace.add(StepName.IDENTITY, Outcome.DENY, "no sandbox identity")
        return _deny(policy, Reason.NO_IDENTITY)
    tenant = policy.tenant(identity.tenant)
    if tenant is None:
        if trace is not None:
            trace.add(StepName.IDENTITY, Outcome.DENY, f"tenant {identity.tenant!r} is not defined")
        return _deny(policy, Reason.NO_IDENTITY, detail="tenant is not defined")
    if trace is not None:
        trace.add(StepName.IDENTITY, Outcome.OK, f"sandbox {identity.sandbox} of tenant {tenant.name}")

    ip = literal_ip(request.host)
    if ip is not None:
        refused = guard.check(ip, by_name=False, tenant_opens=tenant.allow.opens_internal(ip, request.port))
        if refused is not None:
            if trace is not None:
                checked = (AddressCheck(refused.address, "refused", refused.why),)
                trace.add(StepName.ADDRESS_GUARD, Outcome.DENY, refused.why, addresses=checked)
            return _deny(policy, Reason.PRIVATE_ADDRESS, tenant, detail=refused.why, refused=(refused,))
    if trace is not None:
        trace.steps.append(_guard_passed(request.host, ip))

    rule_decision, relaxable, named = _rules(policy, tenant, request, ip, trace, identity.sandbox, grants)
    relaxed = (
        relaxable
        and tenant.mode is Mode.REPORT
        and (rule_decision.reason in RELAXABLE_IN_REPORT_MODE or rule_decision.ask)
    )
    if not rule_decision.allowed:
        if not relaxed and not rule_decision.ask:
            return rule_decision
        if trace is not None and relaxed:
            _trace_relaxed(trace)

    dial: str | None = str(ip) if ip is not None else None
    refusals: tuple[Refusal, ...] = ()
    if dial is None:
        try:
            # Operator ranges opened by name apply only to a name a rule names itself.
            choice = await pick_address(tenant, request, resolver, guard, address, public_only=not named)
        except ResolveError as e:
            if trace is not None:
                trace.add(StepName.RESOLVE, Outcome.DENY, f"cannot resolve: {e}")
            return _deny(policy, Reason.DNS_FAILURE, tenant, detail=str(e))
        if trace is not None:
            trace.steps.append(_resolved(request.host, choice))
        if choice.dial is None:
            # Binding in report mode too: report mode never dials an address a network rule refuses.
            return replace(choice.denial, policy_version=policy.version)
        dial, refusals = choice.dial, choice.refused
    elif trace is not None:
        trace.add(StepName.RESOLVE, Outcome.SKIP, f"{ip} is an address")

    # Rules for the name, and deny rules for the network the dialled address is in, may need
    # per-request checks: either one means the tunnel must be intercepted.
    dial_ip = _parse_ip(dial)
    # A grant that names methods or paths decides per request: its tunnel is intercepted.
    inspect = (
        rule_decision.inspect
        or any(
            index.needs_inspection(request.host, ip, request.port)
            for index in (tenant.allow, tenant.deny, tenant.base_deny, tenant.ask)
        )
        or any(index.needs_inspection("", dial_ip, request.port) for index in (tenant.deny, tenant.base_deny))
    )
    if rule_decision.ask and not relaxed:
        # Held for an operator (sandgate.proxy.approvals): checked like an allowed request up
        # to here, with its address pinned; Rego is asked nothing until it is approved.
        if trace is not None:
            trace.add(StepName.REGO, Outcome.SKIP, "held for approval: Rego is not consulted")
        return replace(rule_decision, inspect=inspect, address=dial, refused=refusals)
    if tenant.rego is not None and not rule_decision.ask:
        # A policy that reads the request can only be applied to intercepted traffic.
        inspect = inspect or tenant.rego.reads_request
        verdict = await _rego(engine or default_engine(), tenant, identity, request, dial)
        if trace is not None:
            _trace_rego(trace, tenant, identity, request, dial, verdict)
        if not verdict.allowed:
            if verdict.fault or tenant.mode is not Mode.REPORT:
                return _deny(
                    policy, verdict.reason, tenant, rule_id=f"{tenant.name}/rego", detail=verdict.message
                )
            if not relaxed:
                rule_decision = _deny(policy, verdict.reason, tenant, rule_id=f"{tenant.name}/rego")
                relaxed = True
    elif trace is not None:
        trace.add(StepName.REGO, Outcome.SKIP, "the tenant has no Rego: the allowlist decides alone")
    if rule_decision.allowed:
        return Decision(
            allowed=True,
            reason=Reason.ALLOWED,
            rule_id=rule_decision.rule_id,
            policy_version=policy.version,
            mode=tenant.mode,
            inspect=inspect and not rule_decision.raw_tcp,
            address=dial,
            raw_tcp=rule_decision.raw_tcp,
            refused=refusals,
        )
    if relaxed:
        return Decision(
            allowed=True,
            reason=rule_decision.reason,
            rule_id=rule_decision.rule_id,
            policy_version=policy.version,
            mode=tenant.mode,
            report_only=True,
            inspect=inspect,
            address=dial,
            refused=refusals,
        )
    return rule_decision


async def _rego(
    engine: PolicyEngine, tenant: TenantPolicy, identity: Identity, request: EgressRequest, dial: str
) -> RegoVerdict:
    """Step 6: the tenant's Rego decision; any exception is a fault, never an allow."""
    assert tenant.rego is not None
    try:
        return await engine.evaluate(RegoQuery.for_request(tenant.rego, identity, request, dial))
    except Exception as e:
        return fault(f"the policy engine failed ({type(e).__name__})")


def literal_ip(host: str) -> IPAddress | None:
    """The address when a normalised host is an IP literal, else None."""
    if not host or not (host[-1].isdigit() or ":" in host):
        return None
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _rules(
    policy: PolicySet,
    tenant: TenantPolicy,
    request: EgressRequest,
    ip: IPAddress | None,
    trace: Trace | None = None,
    sandbox: str = "",
    grants: Grants | None = None,
) -> tuple[Decision, bool, bool]:
    """Steps 3 and 4: the decision, whether report mode may relax a denial, and whether the
    host is named by a rule (the allowing one, not `hosts: ["*"]`; for a denial, any allow
    rule): only then do ranges the operator opens by name apply to it."""
    args = (request.host, ip, request.port, request.method, request.path)
    base = tenant.base_deny.deny_match(*args)
    if base is not None:
        decision = _deny(policy, Reason.HOST_DENIED, tenant, rule_id=base.rule_id)
        if trace is not None:
            trace.add(StepName.DENY_RULES, Outcome.DENY, "the operator's base deny rule matches", base)
        return decision, False, False
    denied = tenant.deny.deny_match(*args)
    if denied is not None:
        # A deny network is binding in report mode, whether the address came literally or by name.
        decision = _deny(policy, Reason.HOST_DENIED, tenant, rule_id=denied.rule_id)
        if trace is not None:
            trace.add(StepName.DENY_RULES, Outcome.DENY, "the tenant's deny rule matches", denied)
        return decision, ip is None, False
    match = tenant.allow.match(*args, no_match=Reason.HOST_NOT_ALLOWED, upgrade=request.upgrade)
    if trace is not None:
        _trace_allow_rules(trace, match)
    if match.rule is not None:
        allowed = Decision(
            allowed=True,
            reason=Reason.ALLOWED,
            rule_id=match.rule.rule_id,
            policy_version=policy.version,
            mode=tenant.mode,
            raw_tcp=match.rule.raw_tcp,
        )
        return allowed, True, not match.any_host
    grant = _granted(tenant, sandbox, grants, request)
    if grant is not None:
        # An approval's grant: allowed as an allow rule would (deny rules refused above, the
        # guard and Rego still follow), without asking again.
        granted = Decision(
            allowed=True,
            reason=Reason.ALLOWED,
            rule_id=grant.rule_id,
            policy_version=policy.version,
            mode=tenant.mode,
            inspect=grant.rule.inspect,
        )
        if trace is not None:
            trace.steps.pop()
            what = f"granted by approval {grant.id} ({grant.scope})"
            trace.add(StepName.ALLOW_RULES, Outcome.OK, what, grant.rule)
        # The guard reads the host as named by a rule only when an allow or ask rule names it
        # (as it did when the request was asked about): a grant opens no operator range.
        return (
            granted,
            True,
            tenant.allow.names_explicitly(request.host) or tenant.ask.names_explicitly(request.host),
        )
    nearest = match.nearest.rule_id if match.nearest else None
    asked = tenant.ask.match(*args, no_match=Reason.HOST_NOT_ALLOWED, upgrade=request.upgrade)
    if asked.rule is not None or tenant.unmatched_ask:
        # No allow rule allows it, an ask rule (or `unmatched: ask`) asks: checked on (step 5)
        # as an allowed request would be, then held for an operator's decision.
        held = Decision(
            reason=Reason.APPROVAL_REQUIRED,
            rule_id=asked.rule.rule_id if asked.rule is not None else f"{tenant.name}/unmatched",
            policy_version=policy.version,
            mode=tenant.mode,
            ask=True,
        )
        if trace is not None:
            how = "an ask rule matches" if asked.rule is not None else "unmatched: ask"
            trace.steps.pop()
            trace.add(StepName.ALLOW_RULES, Outcome.DENY, f"approval_required ({how})", asked.rule)
        by_name = asked.rule is not None and not asked.any_host
        return held, True, by_name or tenant.allow.names_explicitly(request.host)
    # Relaxed in report mode, the name still reaches a by-name range only if a rule names it.
    return (
        _deny(policy, match.reason, tenant, rule_id=nearest),
        True,
        tenant.allow.names_explicitly(request.host),
    )


def _granted(
    tenant: TenantPolicy, sandbox: str, grants: Grants | None, request: EgressRequest
) -> Grant | None:
    """The live grant that allows the request: the tenant's grants file's, then the gateway's."""
    if not tenant.grants and not grants:
        return None
    now = time.time()
    r = request
    args = (tenant.name, sandbox, r.host, r.port, r.method, r.path, r.upgrade, now)
    found = tenant.grants.match(*args)
    if found is None and grants is not None:
        found = grants.match(*args)
    return found


# Resolver answers repeat: parse each address text once, and render each address once.
_parse_ip = functools.lru_cache(maxsize=65_536)(ipaddress.ip_address)
_ip_text = functools.lru_cache(maxsize=65_536)(str)


_NO_DECISION = Decision()


@dataclass(frozen=True, slots=True)
class AddressChoice:
    """Step 5's outcome: the addresses in the order they were checked, the refused ones with
    why, and the one to dial; or, when none may be dialled, the denial."""

    candidates: tuple[str, ...]
    refused: tuple[Refusal, ...]
    dial: str | None
    denial: Decision = _NO_DECISION


async def pick_address(
    tenant: TenantPolicy,
    request: EgressRequest,
    resolver: Resolver,
    guard: AddressGuard,
    pinned: str | None,
    *,
    public_only: bool = True,
) -> AddressChoice:
    """The first resolved address that no deny network covers and the guard permits.

    `public_only`: no rule names the host itself (`hosts: ["*"]`, or report mode), so ranges
    the operator opens by name do not apply. Addresses after the chosen one are not checked.
    """
    candidates = (pinned,) if pinned else (await resolver.resolve(request.host)).addresses
    denied_by = None
    refused: list[Refusal] = []
    for text in candidates:
        try:
            ip = _parse_ip(text)
        except ValueError:
            _keep(refused, Refusal(text, "not an address", "invalid"))
            continue
        args = (ip, request.port, request.method, request.path)
        rule = tenant.base_deny.deny_address(*args) or tenant.deny.deny_address(*args)
        if rule is not None:
            denied_by = denied_by or rule
            why = f"{ip} is in a deny rule's network"
            _keep(refused, Refusal(str(ip), why, "deny_rule", rule_id=rule.rule_id))
            continue
        found = guard.check(
            ip,
            by_name=True,
            tenant_opens=tenant.allow.opens_internal(ip, request.port),
            public_only=public_only,
        )
        if found is None:
            return AddressChoice(candidates, tuple(refused), _ip_text(ip))
        _keep(refused, found)
    if denied_by is not None:
        denial = Decision(
            reason=Reason.HOST_DENIED,
            rule_id=denied_by.rule_id,
            mode=tenant.mode,
            detail="every resolved address is refused",
            refused=tuple(refused),
        )
    else:
        denial = Decision(
            reason=Reason.PRIVATE_ADDRESS,
            mode=tenant.mode,
            detail=refused_detail(refused),
            refused=tuple(refused),
        )
    return AddressChoice(candidates, tuple(refused), None, denial)


def _keep(refused: list[Refusal], refusal: Refusal) -> None:
    if len(refused) < MAX_REFUSALS:
        refused.append(refusal)


def refused_detail(refused: list[Refusal] | tuple[Refusal, ...]) -> str:
    """`every resolved address is refused: <why>; <why>` (the audit detail of step 5's denial)."""
    if not refused:
        return "no address"
    return "every resolved address is refused: " + "; ".join(r.why for r in refused)


def guard_answers(
    tenant: TenantPolicy, name: str, addresses: tuple[str, ...], guard: AddressGuard
) -> tuple[tuple[str, ...], str]:
    """The resolved addresses of an allowed name the guard lets the tenant reach (the DNS
    listener's answers, before any port is known), and why the first refused one is refused.

    The same guard as step 5: the connection that follows is decided again with its port.
    """
    public_only = not tenant.allow.names_explicitly(name)
    permitted: list[str] = []
    refused = ""
    for text in addresses:
        try:
            ip = _parse_ip(text)
        except ValueError:
            continue
        why = guard.refusal(
            ip, by_name=True, tenant_opens=tenant.allow.opens_internal(ip, None), public_only=public_only
        )
        if why is None:
            permitted.append(str(ip))
        else:
            refused = refused or why
    return tuple(permitted), refused


def _deny(
    policy: PolicySet,
    reason: Reason,
    tenant: TenantPolicy | None = None,
    *,
    rule_id: str | None = None,
    detail: str = "",
    refused: tuple[Refusal, ...] = (),
) -> Decision:
    return Decision(
        allowed=False,
        reason=reason,
        rule_id=rule_id,
        policy_version=policy.version,
        mode=tenant.mode if tenant else Mode.ENFORCE,
        detail=detail,
        refused=refused,
    )


# --- the trace: what each step found, recorded only when `decide` is given a Trace ----------


def _guard_passed(host: str, ip: IPAddress | None) -> Step:
    """Step 2 when the guard did not refuse: a name skips it, a literal may be dialled."""
    if ip is None:
        detail = f"{host} is a name: its addresses are checked in step {StepName.RESOLVE.number}"
        return Step(StepName.ADDRESS_GUARD, Outcome.SKIP, detail)
    dialled = (AddressCheck(str(ip), "dial"),)
    return Step(StepName.ADDRESS_GUARD, Outcome.OK, f"{ip} may be dialled", addresses=dialled)


def _trace_allow_rules(trace: Trace, match: RuleMatch) -> None:
    """Steps 3 (no deny rule matched) and 4 (the allow rules' match, or why none did)."""
    trace.add(StepName.DENY_RULES, Outcome.OK, "no deny rule matches")
    if match.rule is not None:
        how = 'hosts: ["*"] matches (public addresses only)' if match.any_host else "an allow rule matches"
        trace.add(StepName.ALLOW_RULES, Outcome.OK, how, match.rule)
    elif match.nearest is not None:
        trace.add(StepName.ALLOW_RULES, Outcome.DENY, f"{match.reason.value} (nearest rule)", match.nearest)
    else:
        trace.add(StepName.ALLOW_RULES, Outcome.DENY, f"{match.reason.value}: no rule names this destination")


def _trace_relaxed(trace: Trace) -> None:
    """Report mode lets the rules step that denied through: it would deny."""
    denied = trace.steps.pop()
    trace.steps.append(replace(denied, outcome=Outcome.WOULD_DENY))
    if denied.name is StepName.DENY_RULES:
        trace.add(StepName.ALLOW_RULES, Outcome.SKIP, "a deny rule matched: allow rules are not asked")


def _resolved(host: str, choice: AddressChoice) -> Step:
    """Step 5: what the name resolved to, and each address refused, dialled or not checked."""
    checked = address_checks(choice.candidates, choice.refused, choice.dial)
    resolved = f"{host} → {', '.join(choice.candidates)}"
    if choice.dial is None:
        denial = choice.denial
        detail = f"{resolved}: {denial.reason.value}, no address may be dialled"
        return Step(StepName.RESOLVE, Outcome.DENY, detail, denial.rule_id, addresses=checked)
    detail = resolved if len(choice.candidates) == 1 else f"{resolved}: dials {choice.dial}"
    return Step(StepName.RESOLVE, Outcome.OK, detail, addresses=checked)


def _trace_rego(
    trace: Trace,
    tenant: TenantPolicy,
    identity: Identity,
    request: EgressRequest,
    dial: str,
    verdict: RegoVerdict,
) -> None:
    """Step 6: the verdict, and the modules and input document it was given."""
    assert tenant.rego is not None
    if verdict.allowed:
        outcome = Outcome.OK
    elif verdict.fault:
        outcome = Outcome.ERROR
    else:
        outcome = Outcome.WOULD_DENY if tenant.mode is Mode.REPORT else Outcome.DENY
    detail = verdict.reason.value + (f": {verdict.message}" if verdict.message else "")
    trace.add(StepName.REGO, outcome, detail, rule_id=f"{tenant.name}/rego")
    modules = tuple(m.path for m in tenant.rego.modules)
    trace.rego = RegoTrace(modules, input_document(identity, request, dial), verdict)
