"""The evaluation order as lists of steps over one `Evaluation` (sandgate.policy.evaluation).

A step reads what the steps before it found, records what it finds, and returns the final
Decision when it decides, or None to go on. `evaluate` runs a list and, when a trace is asked
for, has each step's explainer (sandgate.policy.steps_trace) record what it found: no step
records anything itself. `decide` runs REQUEST_STEPS, `decide_name` DNS_STEPS
(sandgate.policy.decide, whose docstrings state the order and each step's reasons).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

from sandgate.policy import steps_trace as explain
from sandgate.policy.address_choice import literal_ip, parse_ip, pick_address
from sandgate.policy.decision import RELAXABLE_IN_REPORT_MODE, Decision, Identity
from sandgate.policy.errors import ResolveError
from sandgate.policy.evaluation import CredentialBindings, Evaluation, RulesOutcome
from sandgate.policy.matcher import RuleMatch
from sandgate.policy.model.grants import Grant
from sandgate.policy.reasons import Reason
from sandgate.policy.rego.engine import make_engine
from sandgate.policy.rego.protocol import PolicyEngine, RegoQuery, RegoVerdict, fault
from sandgate.policy.trace import StepName, Trace

__all__ = [
    "DNS_STEPS",
    "REQUEST_STEPS",
    "RESERVED_DETAIL",
    "PathStep",
    "credential_interception",
    "default_engine",
    "evaluate",
]

RESERVED_DETAIL = "the gateway's own name: answered over plain HTTP on port 80 only"

_ALLOWED, _GRANTED = RulesOutcome.ALLOWED, RulesOutcome.GRANTED
_ASKED, _WOULD_DENY = RulesOutcome.ASKED, RulesOutcome.WOULD_DENY

_default_engine: PolicyEngine | None = None


def default_engine() -> PolicyEngine:
    """The engine `decide` uses when none is passed: embedded, with a decision cache."""
    global _default_engine
    if _default_engine is None:
        _default_engine = make_engine("embedded")
    return _default_engine


# --- the request's steps (decide) -------------------------------------------------------------


def reserved_name(ev: Evaluation) -> Decision | None:
    """Step 0: the gateway's own name is never a destination, whoever asks and whatever the rules."""
    if ev.reserved is not None and ev.request.host == ev.reserved:
        return Decision(reason=Reason.RESERVED_HOST, policy_version=ev.policy.version, detail=RESERVED_DETAIL)
    return None


def identity(ev: Evaluation) -> Decision | None:
    """Step 1: a sandbox, of a tenant the policy defines."""
    if ev.identity is None:
        return Decision(reason=Reason.NO_IDENTITY, policy_version=ev.policy.version)
    tenant = ev.policy.tenant(ev.identity.tenant)
    if tenant is None:
        return Decision(
            reason=Reason.NO_IDENTITY, policy_version=ev.policy.version, detail="tenant is not defined"
        )
    ev.who, ev.tenant = ev.identity, tenant
    return None


def address_guard(ev: Evaluation) -> Decision | None:
    """Step 2: an IP-literal destination passes the operator's address guard (a name: step 5)."""
    ip = ev.ip = literal_ip(ev.request.host)
    if ip is None:
        return None
    opens = ev.tenant.allow.opens_internal(ip, ev.request.port)
    refused = ev.guard.check(ip, by_name=False, tenant_opens=opens)
    if refused is None:
        return None
    return ev.deny(Reason.PRIVATE_ADDRESS, detail=refused.why, refused=(refused,))


def base_deny(ev: Evaluation) -> Decision | None:
    """Step 3, first: the operator's base deny rules, binding in every mode."""
    r = ev.request
    rule = ev.tenant.base_deny.deny_match(r.host, ev.ip, r.port, r.method, r.path)
    if rule is None:
        return None
    ev.rule = rule
    return ev.deny(Reason.HOST_DENIED, rule_id=rule.rule_id)


def tenant_deny(ev: Evaluation) -> Decision | None:
    """Step 3: the tenant's deny rules. Report mode lets a denied name through; a deny network
    stays binding in report mode, whether the address came literally or (step 5) by name."""
    r = ev.request
    rule = ev.tenant.deny.deny_match(r.host, ev.ip, r.port, r.method, r.path)
    if rule is None:
        return None
    ev.rule = rule
    if ev.ip is None and ev.reports:
        _would_deny(ev, Reason.HOST_DENIED, rule.rule_id, named=False)
        return None
    return ev.deny(Reason.HOST_DENIED, rule_id=rule.rule_id)


def allow_rules(ev: Evaluation) -> Decision | None:
    """Step 4: an allow rule (`hosts: ["*"]` last, never for an IP literal), else a live grant,
    else an ask rule; else denied with why the nearest rule did not match.

    Sets whether a rule names the host: only then do ranges the operator opens by name apply.
    """
    if ev.outcome is not None:
        return None  # a deny rule matched, and report mode let it through
    r, tenant = ev.request, ev.tenant
    match = ev.match = tenant.allow.match(
        r.host, ev.ip, r.port, r.method, r.path, no_match=Reason.HOST_NOT_ALLOWED, upgrade=r.upgrade
    )
    if match.rule is not None:
        ev.outcome, ev.rule, ev.rule_id = _ALLOWED, match.rule, match.rule.rule_id
        ev.raw_tcp, ev.named = match.rule.raw_tcp, not match.any_host
        return None
    grant = _granted(ev)
    if grant is not None:
        # An approval's grant: allowed as an allow rule would (deny rules refused above, the
        # guard and Rego still follow), without asking again. The host counts as named only
        # when an allow or ask rule names it (as when it was asked about): a grant opens no
        # operator range.
        ev.outcome, ev.grant, ev.rule, ev.rule_id = _GRANTED, grant, grant.rule, grant.rule_id
        ev.raw_tcp = False
        ev.named = tenant.allow.names_explicitly(r.host) or tenant.ask.names_explicitly(r.host)
        return None
    return _ask_or_deny(ev, match)


def _ask_or_deny(ev: Evaluation, match: RuleMatch) -> Decision | None:
    """Step 4, when no allow rule or grant allows: asked about, or denied."""
    r, tenant = ev.request, ev.tenant
    asked = tenant.ask.match(
        r.host, ev.ip, r.port, r.method, r.path, no_match=Reason.HOST_NOT_ALLOWED, upgrade=r.upgrade
    )
    if asked.rule is not None or tenant.unmatched_ask:
        # Checked on (step 5) as an allowed request would be, then held for an operator (step 6).
        ev.outcome, ev.rule, ev.reason = _ASKED, asked.rule, Reason.APPROVAL_REQUIRED
        ev.rule_id = asked.rule.rule_id if asked.rule is not None else f"{tenant.name}/unmatched"
        by_name = asked.rule is not None and not asked.any_host
        ev.named = by_name or tenant.allow.names_explicitly(r.host)
        return None
    nearest = match.nearest.rule_id if match.nearest is not None else None
    if ev.reports and match.reason in RELAXABLE_IN_REPORT_MODE:
        # Relaxed, the name still reaches a by-name range only if a rule names it.
        ev.rule = match.nearest
        _would_deny(ev, match.reason, nearest, named=tenant.allow.names_explicitly(r.host))
        return None
    return ev.deny(match.reason, rule_id=nearest)


def _would_deny(ev: Evaluation, reason: Reason, rule_id: str | None, *, named: bool) -> None:
    """Report mode lets a denial by the tenant's own rules through: recorded as would-deny."""
    ev.outcome, ev.reason, ev.rule_id, ev.named = _WOULD_DENY, reason, rule_id, named


def _granted(ev: Evaluation) -> Grant | None:
    """The live grant that allows the request: the tenant's grants file's, then the gateway's."""
    tenant, grants = ev.tenant, ev.grants
    if not tenant.grants and not grants:
        return None
    r = ev.request
    args = (tenant.name, ev.who.sandbox, r.host, r.port, r.method, r.path, r.upgrade, time.time())
    uses = grants.uses if grants is not None else None
    skip, spent = ev.skip, uses.spent if uses is not None else None

    def passed_over(g: Grant) -> bool:
        # A counted grant used up (known here), or whose use could not be taken: as if gone.
        return g.max_uses is not None and (g.id in skip or (spent is not None and spent(g.id)))

    found = tenant.grants.match(*args, skip=passed_over)
    if found is None and grants is not None:
        found = grants.match(*args, skip=passed_over)
    return found


async def resolve(ev: Evaluation) -> Decision | None:
    """Step 5: a name is resolved (only now that the rules allow it), and the first address no
    deny network covers and the guard permits is pinned; a literal or a pinned address is
    checked, not resolved."""
    if ev.ip is not None:
        ev.dial, ev.refused = str(ev.ip), ()
        return None
    try:
        # Operator ranges opened by name apply only to a name a rule names itself.
        choice = await pick_address(
            ev.tenant, ev.request, ev.resolver, ev.guard, ev.address, public_only=not ev.named
        )
    except ResolveError as e:
        return ev.deny(Reason.DNS_FAILURE, detail=str(e))
    ev.choice = choice
    if choice.dial is None:
        # Binding in report mode too: report mode never dials an address a network rule refuses.
        return replace(choice.denial, policy_version=ev.policy.version)
    ev.dial, ev.refused = choice.dial, choice.refused
    return None


async def rego(ev: Evaluation) -> Decision | None:
    """Step 6: an asked request is held here; otherwise, for a tenant with Rego, its decision
    must allow too (report mode records its denial as would-deny; a fault always denies)."""
    tenant = ev.tenant
    if ev.outcome is _ASKED:
        if ev.reports:
            return None  # would deny (approval_required); Rego is not asked
        # Held for an operator (sandgate.proxy.approvals), its address pinned: Rego is asked
        # nothing until it is approved.
        return Decision(
            reason=Reason.APPROVAL_REQUIRED,
            rule_id=ev.rule_id,
            policy_version=ev.policy.version,
            mode=tenant.mode,
            inspect=_inspect(ev),
            address=ev.dial,
            ask=True,
            refused=ev.refused,
        )
    if tenant.rego is None:
        return None
    verdict = ev.verdict = await _ask_rego(ev)
    if verdict.allowed:
        return None
    if verdict.fault or not ev.reports:
        return ev.deny(verdict.reason, rule_id=f"{tenant.name}/rego", detail=verdict.message)
    if ev.outcome is not _WOULD_DENY:
        ev.outcome, ev.reason, ev.rule_id = _WOULD_DENY, verdict.reason, f"{tenant.name}/rego"
    return None


async def _ask_rego(ev: Evaluation) -> RegoVerdict:
    """The tenant's Rego decision; any exception is a fault, never an allow."""
    assert ev.tenant.rego is not None
    engine = ev.engine or default_engine()
    try:
        return await engine.evaluate(
            RegoQuery.for_request(ev.tenant.rego, ev.who, ev.rego_request(), ev.dial)
        )
    except Exception as e:
        return fault(f"the policy engine failed ({type(e).__name__})")


def credentials(ev: Evaluation) -> Decision | None:
    """Step 7: the tenant's credentials bound to the destination. Decides nothing: the broker
    injects them later, and a bound host's tunnel is intercepted (`credential_interception`)."""
    ev.bound_credentials()
    return None


def credential_interception(
    decision: Decision, bindings: CredentialBindings | None, identity: Identity | None, host: str, port: int
) -> Decision:
    """`decision`, intercepting when a credential of the tenant is bound to host:port (the broker
    must see its requests). Not a step: the gateway applies it to a tunnel's decision once any
    hold is over, and a held request is released by an operator after the steps ran."""
    if decision.inspect or not decision.allowed or identity is None or bindings is None:
        return decision
    if bindings.bound_names(identity.tenant, host, port):
        return replace(decision, inspect=True)
    return decision


def _inspect(ev: Evaluation) -> bool:
    """Whether the tunnel must be intercepted: a grant that names methods or paths, or a rule
    for the name or a deny rule for the dialled address's network that checks each request."""
    r, tenant = ev.request, ev.tenant
    if ev.outcome is _GRANTED and ev.grant.rule.inspect:
        return True
    host, ip, port = r.host, ev.ip, r.port
    if (
        tenant.allow.needs_inspection(host, ip, port)
        or tenant.deny.needs_inspection(host, ip, port)
        or tenant.base_deny.needs_inspection(host, ip, port)
        or tenant.ask.needs_inspection(host, ip, port)
    ):
        return True
    dial_ip = parse_ip(ev.dial)
    return tenant.deny.needs_inspection("", dial_ip, port) or tenant.base_deny.needs_inspection(
        "", dial_ip, port
    )


def conclude(ev: Evaluation) -> Decision:
    """After the last step: allowed, or in report mode allowed and recorded as would-deny."""
    tenant = ev.tenant
    # A policy that reads the request can only be applied to intercepted traffic.
    inspect = _inspect(ev) or (
        ev.verdict is not None and tenant.rego is not None and tenant.rego.reads_request
    )
    if ev.outcome is _ALLOWED or ev.outcome is _GRANTED:
        return Decision(
            allowed=True,
            reason=Reason.ALLOWED,
            rule_id=ev.rule_id,
            policy_version=ev.policy.version,
            mode=tenant.mode,
            inspect=inspect and not ev.raw_tcp,
            address=ev.dial,
            raw_tcp=ev.raw_tcp,
            messages=ev.rule.messages if ev.rule is not None else None,
            refused=ev.refused,
        )
    if ev.outcome is _WOULD_DENY or ev.outcome is _ASKED:
        return Decision(
            allowed=True,
            reason=ev.reason,
            rule_id=ev.rule_id,
            policy_version=ev.policy.version,
            mode=tenant.mode,
            report_only=True,
            inspect=inspect,
            address=ev.dial,
            refused=ev.refused,
        )
    return ev.deny(Reason.INTERNAL_ERROR, detail="the rules came to no outcome")


# --- the DNS listener's steps (decide_name) ---------------------------------------------------


def dns_identity(ev: Evaluation) -> Decision | None:
    """DNS step 1: as step 1 (its records name no detail)."""
    who = ev.identity
    tenant = ev.policy.tenant(who.tenant) if who is not None else None
    if who is None or tenant is None:
        return Decision(reason=Reason.NO_IDENTITY, policy_version=ev.policy.version)
    ev.who, ev.tenant = who, tenant
    return None


def dns_name(ev: Evaluation) -> Decision:
    """DNS step 2: a name a deny rule refuses outright, or that no allow rule or live grant
    names, is not looked up (dns_denied); the others are answered."""
    tenant, name = ev.tenant, ev.request.host
    version, mode = ev.policy.version, tenant.mode
    denied = tenant.refuses_name(name)
    if denied is not None:
        # Never looked up: the lookup itself would reach the name's nameservers.
        ev.rule = denied
        detail = "a deny rule refuses this name"
        return Decision(
            reason=Reason.DNS_DENIED, rule_id=denied.rule_id, policy_version=version, mode=mode, detail=detail
        )
    now = time.time()
    if tenant.allow.names_host(name):
        ev.outcome = _ALLOWED
    elif tenant.grants.names_host(tenant.name, ev.who.sandbox, name, now) or (
        ev.grants is not None and ev.grants.names_host(tenant.name, ev.who.sandbox, name, now)
    ):
        # A grant's host is answered too: its connections are decided with the grant.
        ev.outcome = _GRANTED
    else:
        # A denied name is not resolved, and its existence is not revealed (NXDOMAIN).
        return Decision(reason=Reason.DNS_DENIED, policy_version=version, mode=mode)
    return Decision(allowed=True, reason=Reason.ALLOWED, policy_version=version, mode=mode)


# --- the lists, and the one loop that runs them -----------------------------------------------

Run = Callable[[Evaluation], Decision | None]
Wait = Callable[[Evaluation], Awaitable[Decision | None]]
Explain = Callable[[Evaluation, Decision | None, Trace], None]


@dataclass(frozen=True, slots=True)
class PathStep:
    """One step: `run` (or, when it waits on the resolver or Rego, `wait`) and its explainer.

    A slotted class, not a NamedTuple: `evaluate` reads each step's fields once per decision,
    and unpacking a NamedTuple takes the slow path (about twice the loop's time).
    """

    name: StepName
    run: Run | None
    wait: Wait | None
    explain: Explain


REQUEST_STEPS = (
    PathStep(StepName.RESERVED_NAME, reserved_name, None, explain.reserved_name),
    PathStep(StepName.IDENTITY, identity, None, explain.identity),
    PathStep(StepName.ADDRESS_GUARD, address_guard, None, explain.address_guard),
    PathStep(StepName.DENY_RULES, base_deny, None, explain.base_deny),
    PathStep(StepName.DENY_RULES, tenant_deny, None, explain.tenant_deny),
    PathStep(StepName.ALLOW_RULES, allow_rules, None, explain.allow_rules),
    PathStep(StepName.RESOLVE, None, resolve, explain.resolve),
    PathStep(StepName.REGO, None, rego, explain.rego),
    PathStep(StepName.CREDENTIALS, credentials, None, explain.credentials),
)
DNS_STEPS = (
    PathStep(StepName.IDENTITY, dns_identity, None, explain.identity),
    PathStep(StepName.DNS_NAME, dns_name, None, explain.dns_name),
)


async def evaluate(steps: tuple[PathStep, ...], ev: Evaluation, trace: Trace | None) -> Decision:
    """Run `steps` until one decides (else `conclude`), recording each in `trace` when given."""
    if trace is not None:
        return await _evaluate_traced(steps, ev, trace)
    for step in steps:
        run = step.run
        if run is not None:
            found = run(ev)
        else:
            assert step.wait is not None
            found = await step.wait(ev)
        if found is not None:
            return found
    return conclude(ev)


async def _evaluate_traced(steps: tuple[PathStep, ...], ev: Evaluation, trace: Trace) -> Decision:
    """`evaluate`, each step followed by its explainer."""
    for step in steps:
        if step.run is not None:
            found = step.run(ev)
        else:
            assert step.wait is not None
            found = await step.wait(ev)
        step.explain(ev, found, trace)
        if found is not None:
            return found
    return conclude(ev)
