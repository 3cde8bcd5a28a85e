"""Step 5's address choice: which resolved address a request may dial, and why others may not.

Also the IP-literal test of step 2 and the DNS listener's filter of its answers: every place
the gateway turns a name or a literal into an address it may dial is here, so the guard is
asked the same way everywhere.
"""

from __future__ import annotations

import functools
import ipaddress
from dataclasses import dataclass

from sandgate.policy.address_guard import AddressGuard, IPAddress
from sandgate.policy.decision import Decision, EgressRequest, Refusal
from sandgate.policy.model.policyset import TenantPolicy
from sandgate.policy.reasons import Reason
from sandgate.policy.resolver import Resolver

__all__ = [
    "MAX_REFUSALS",
    "AddressChoice",
    "guard_answers",
    "literal_ip",
    "parse_ip",
    "pick_address",
    "refused_detail",
]

# Refusals kept per decision (a name can resolve to hundreds of addresses): the first ones.
MAX_REFUSALS = 16


def literal_ip(host: str) -> IPAddress | None:
    """The address when a normalised host is an IP literal, else None."""
    if not host or not (host[-1].isdigit() or ":" in host):
        return None
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


# Resolver answers repeat: parse each address text once, and render each address once.
parse_ip = functools.lru_cache(maxsize=65_536)(ipaddress.ip_address)
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
            ip = parse_ip(text)
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
            ip = parse_ip(text)
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
