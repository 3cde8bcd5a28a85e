"""The evaluation order, written once. Every other module asks this one."""

from __future__ import annotations

import ipaddress

from .decision import RELAXABLE_IN_REPORT_MODE, Decision, EgressRequest, Identity, Mode
from .errors import ResolveError
from .guard import AddressGuard, IPAddress
from .policyset import PolicySet, TenantPolicy
from .reasons import Reason
from .resolver import Resolver

__all__ = ["decide", "literal_ip"]


async def decide(
    policy: PolicySet,
    identity: Identity | None,
    request: EgressRequest,
    resolver: Resolver,
    guard: AddressGuard,
    *,
    address: str | None = None,
) -> Decision:
    """Decide one request. The order, and the reason each step denies with:

    1. identity: no sandbox, or its tenant is gone                      → no_identity
    2. an IP-literal destination: the address guard (a tenant `cidr`
       rule may cover a private address)                                → private_address
    3. tenant deny rules, the operator's base deny rules among them     → host_denied
    4. tenant allow rules                                               → host_not_allowed,
                                                                          port_not_allowed,
                                                                          method_not_allowed,
                                                                          path_not_allowed
    5. a name: resolve it with the gateway's resolver, keep the first
       address the guard permits, and pin it for dialling               → dns_failure,
                                                                          private_address
    6. (Rego, when the tenant has a policy module)                      → policy_denied
    In report mode, denials of steps 3, 4 and 6 allow and are recorded as would-deny.

    Names are resolved only after the rules allow them (step 5 after 3–4), so the gateway
    never looks up a name a tenant may not reach: its resolver is no DNS exfiltration channel.
    `address` is the address already pinned for this connection (per-request decisions
    inside an approved tunnel); it is re-checked, not re-resolved.
    """
    if identity is None:
        return _deny(policy, Reason.NO_IDENTITY)
    tenant = policy.tenant(identity.tenant)
    if tenant is None:
        return _deny(policy, Reason.NO_IDENTITY, detail="tenant is not defined")

    ip = literal_ip(request.host)
    if ip is not None and not guard.permits(
        ip, by_name=False, tenant_covers=tenant.allow.covers_address(ip, request.port)
    ):
        return _deny(policy, Reason.PRIVATE_ADDRESS, tenant)

    rule_decision = _rules(policy, tenant, request, ip)
    relaxed = tenant.mode is Mode.REPORT and rule_decision.reason in RELAXABLE_IN_REPORT_MODE
    if not rule_decision.allowed and not relaxed:
        return rule_decision

    dial: str | None = str(ip) if ip is not None else None
    if dial is None:
        try:
            dial = await _pick_address(tenant, request, resolver, guard, address)
        except ResolveError as e:
            return _deny(policy, Reason.DNS_FAILURE, tenant, detail=str(e))
        if dial is None:
            return _deny(policy, Reason.PRIVATE_ADDRESS, tenant)

    inspect = tenant.allow.needs_inspection(request.host, ip, request.port) or tenant.deny.needs_inspection(
        request.host, ip, request.port
    )
    if rule_decision.allowed:
        return Decision(
            allowed=True,
            reason=Reason.ALLOWED,
            rule_id=rule_decision.rule_id,
            policy_version=policy.version,
            mode=tenant.mode,
            inspect=inspect,
            address=dial,
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
        )
    return rule_decision


def literal_ip(host: str) -> IPAddress | None:
    """The address when a normalised host is an IP literal, else None."""
    if not host or not (host[-1].isdigit() or ":" in host):
        return None
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _rules(policy: PolicySet, tenant: TenantPolicy, request: EgressRequest, ip: IPAddress | None) -> Decision:
    denied = tenant.deny.deny_match(request.host, ip, request.port, request.method, request.path)
    if denied is not None:
        return _deny(policy, Reason.HOST_DENIED, tenant, rule_id=denied.rule_id)
    match = tenant.allow.match(
        request.host,
        ip,
        request.port,
        request.method,
        request.path,
        no_match=Reason.HOST_NOT_ALLOWED,
    )
    if match.rule is not None:
        return Decision(
            allowed=True,
            reason=Reason.ALLOWED,
            rule_id=match.rule.rule_id,
            policy_version=policy.version,
            mode=tenant.mode,
        )
    nearest = match.nearest.rule_id if match.nearest else None
    return _deny(policy, match.reason, tenant, rule_id=nearest)


async def _pick_address(
    tenant: TenantPolicy,
    request: EgressRequest,
    resolver: Resolver,
    guard: AddressGuard,
    pinned: str | None,
) -> str | None:
    candidates: tuple[str, ...] = (pinned,) if pinned else (await resolver.resolve(request.host)).addresses
    for text in candidates:
        try:
            ip = ipaddress.ip_address(text)
        except ValueError:
            continue
        if guard.permits(ip, by_name=True, tenant_covers=tenant.allow.covers_address(ip, request.port)):
            return str(ip)
    return None


def _deny(
    policy: PolicySet,
    reason: Reason,
    tenant: TenantPolicy | None = None,
    *,
    rule_id: str | None = None,
    detail: str = "",
) -> Decision:
    return Decision(
        allowed=False,
        reason=reason,
        rule_id=rule_id,
        policy_version=policy.version,
        mode=tenant.mode if tenant else Mode.ENFORCE,
        detail=detail,
    )
