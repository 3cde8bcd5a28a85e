"""The evaluation order, written once. Every other module asks this one.

The steps themselves are in sandgate.policy.steps, one function each, in this order; what
they find is in sandgate.policy.evaluation, and how each is explained in steps_trace.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any

from sandgate.policy.address_choice import (
    AddressChoice,
    guard_answers,
    literal_ip,
    pick_address,
    refused_detail,
)
from sandgate.policy.address_guard import AddressGuard
from sandgate.policy.decision import Decision, EgressRequest, Identity, Phase
from sandgate.policy.evaluation import CredentialBindings, Evaluation, RulesOutcome
from sandgate.policy.model.grants import Grant, Grants
from sandgate.policy.model.policyset import PolicySet, TenantPolicy
from sandgate.policy.rego.protocol import PolicyEngine
from sandgate.policy.resolver import Resolver
from sandgate.policy.steps import DNS_STEPS, REQUEST_STEPS, credential_interception, default_engine, evaluate
from sandgate.policy.trace import Trace

__all__ = [
    "AddressChoice",
    "CredentialBindings",
    "credential_interception",
    "decide",
    "decide_name",
    "default_engine",
    "guard_answers",
    "literal_ip",
    "pick_address",
    "refused_detail",
]


def decide(
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
    reserved: str | None = None,
    bindings: CredentialBindings | None = None,
) -> Coroutine[Any, Any, Decision]:
    """Decide one request (await it). The order, and the reason each step denies with:

    0. the reserved name: the gateway's own (`reserved`, its approvals
       endpoint) is no destination, whoever asks                        → reserved_host
    1. identity: no sandbox, or its tenant is gone                      → no_identity
    2. an IP-literal destination: the address guard                     → private_address
    3. tenant deny rules, the operator's base deny rules among them     → host_denied
    4. tenant allow rules (`hosts: ["*"]` last, and never for an
       IP literal), then the grants approvals added (the tenant's
       grants file, and `grants`: the gateway's sandbox and fleet
       grants), live ones only (a counted one with uses left: once the
       request is allowed, one of its uses is taken, and with none left
       it is decided again without that grant), then ask rules
       (`unmatched: ask`)                                                → host_not_allowed,
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
       must allow too (the input document carries the address of step 5
       and the credentials of step 7)                                    → policy_denied or
       the code the policy names; an engine fault                        → policy_error.
       A request an ask rule matched is held here instead, unasked       → approval_required
    7. credentials: the tenant's credentials `bindings` binds to the
       destination (Rego's input.credentials; the broker injects
       them later). Decides nothing.
    In report mode, denials by the tenant's own rules in steps 3, 4 and 6 allow and are
    recorded as would-deny (an ask, too: approval_required); the operator's base rules, deny
    networks, the address guard and policy_error always hold.

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
    ev = Evaluation(policy, identity, request, grants)
    ev.resolver = resolver
    ev.guard = guard
    ev.engine = engine
    ev.address = address
    ev.reserved = reserved
    ev.bindings = bindings
    return _steps(ev, trace)


def _steps(ev: Evaluation, trace: Trace | None) -> Coroutine[Any, Any, Decision]:
    """The request's steps; for a tenant with protocol sections, followed by applying them; a
    request a counted grant may allow, followed by taking one of its uses (_counted)."""
    who = ev.identity
    tenant = ev.policy.tenant(who.tenant) if who is not None else None
    if _may_count(ev, tenant):
        return _counted(ev, trace)
    if tenant is None or not tenant.allow.has_sections:
        # The steps' coroutine itself, not one awaiting it: one coroutine per decision, not two.
        return evaluate(REQUEST_STEPS, ev, trace)
    return _sectioned(ev, trace)


async def _sectioned(ev: Evaluation, trace: Trace | None) -> Decision:
    """The steps' decision with the protocol section of its host and port (Evaluation.with_sections)."""
    return ev.with_sections(await evaluate(REQUEST_STEPS, ev, trace))


def _may_count(ev: Evaluation, tenant: TenantPolicy | None) -> bool:
    """Whether a counted grant (`max_uses`) may allow this request, and the gateway counts: an
    HTTP request only (a connection, a TLS hello, a DNS name take no use; a counted grant's
    requests are each decided, its connection intercepted)."""
    counts = ev.grants is not None and ev.grants.uses is not None
    return (
        counts
        and tenant is not None
        and ev.request.phase is Phase.REQUEST
        and (tenant.grants.counted or (ev.grants is not None and ev.grants.counted))
    )


async def _counted(ev: Evaluation, trace: Trace | None) -> Decision:
    """The steps' decision; when a counted grant allowed it, one of the grant's uses is taken,
    atomically. None left, or the count out of reach: decided again as without that grant
    (another grant, an ask rule, or a denial), so exactly max_uses requests pass."""
    tenant = ev.policy.tenant(ev.identity.tenant) if ev.identity is not None else None
    while True:
        decision = await evaluate(REQUEST_STEPS, ev, trace)
        if tenant is not None and tenant.allow.has_sections:
            decision = ev.with_sections(decision)
        grant = ev.grant if ev.outcome is RulesOutcome.GRANTED else None
        uses = ev.grants.uses if ev.grants is not None else None
        if grant is None or grant.max_uses is None or uses is None or not decision.allowed:
            return decision
        if await uses.take(grant):
            return decision
        ev = _again(ev, grant)


def _again(ev: Evaluation, spent: Grant) -> Evaluation:
    """A fresh evaluation of the same request that passes over `spent` (and those before it)."""
    again = Evaluation(ev.policy, ev.identity, ev.request, ev.grants)
    again.resolver, again.guard, again.engine = ev.resolver, ev.guard, ev.engine
    again.address, again.reserved, again.bindings = ev.address, ev.reserved, ev.bindings
    again.skip = ev.skip | {spent.id}
    return again


async def decide_name(
    policy: PolicySet,
    identity: Identity | None,
    name: str,
    *,
    grants: Grants | None = None,
    trace: Trace | None = None,
) -> Decision:
    """Decide a guest's DNS query for a normalised `name` (the DNS listener). The order:

    1. identity: no sandbox, or its tenant is gone                      → no_identity
    2. the DNS name: a deny rule that refuses it outright (the operator's,
       or the tenant's unless in report mode), or no allow rule, grant
       file entry or gateway grant (`grants`) that names it             → dns_denied
    An allowed name is then resolved and its answers filtered by the guard (`guard_answers`);
    a denied one is never looked up, so the lookup is no channel out of the sandbox.
    """
    ev = Evaluation(policy, identity, EgressRequest(Phase.DNS, name, 53), grants)
    return await evaluate(DNS_STEPS, ev, trace)
