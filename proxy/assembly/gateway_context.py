"""The gateway context's builder: the policy in force and what every decision uses (resolver,
address guard, name bindings, audit trail, broker, Rego engine)."""

from __future__ import annotations

from dataclasses import dataclass

from sandgate.brokers import Broker
from sandgate.policy.address_guard import AddressGuard
from sandgate.policy.model.policyset import PolicySet
from sandgate.policy.rego.protocol import PolicyEngine
from sandgate.policy.resolver import Resolver
from sandgate.proxy.audit.trail import AuditLog
from sandgate.proxy.config import GatewayConfig
from sandgate.proxy.context import GatewayContext
from sandgate.proxy.dns.name_bindings import NameBindings
from sandgate.proxy.net.host_addresses import OwnAddressWatcher, own_addresses
from sandgate.proxy.startup.resolver_setup import build_resolver

__all__ = ["ContextParts", "build_context"]


@dataclass(frozen=True)
class ContextParts:
    ctx: GatewayContext
    # Follows the gateway's own addresses as interfaces come and go (None: the config lists them).
    own_watch: OwnAddressWatcher | None


def build_context(
    config: GatewayConfig,
    policy: PolicySet,
    audit: AuditLog,
    broker: Broker,
    engine: PolicyEngine,
    resolver: Resolver | None,
) -> ContextParts:
    """The context; `resolver` replaces the configured one (tests)."""
    guard_cfg = config.address_guard
    own = own_addresses() if guard_cfg.own_addresses == "auto" else guard_cfg.own_addresses
    tcfg = config.transparent
    ctx = GatewayContext(
        policy=policy,
        resolver=resolver or build_resolver(config.resolver),
        guard=AddressGuard(guard_cfg.reachable_by_name, own, guard_cfg.tenant_reachable),
        audit=audit,
        bindings=NameBindings(min_ttl=tcfg.binding_min_ttl, max_ttl=tcfg.binding_max_ttl),
        reroute=tcfg.reroute,
        broker=broker,
        engine=engine,
    )
    if guard_cfg.own_addresses != "auto":
        return ContextParts(ctx, None)

    def changed(addresses: frozenset[str]) -> None:
        # One assignment: no request sees half of the new set.
        ctx.guard = ctx.guard.with_own_addresses(addresses)

    watch = OwnAddressWatcher(changed, frozenset(own), interval=guard_cfg.refresh_seconds)
    return ContextParts(ctx, watch)
