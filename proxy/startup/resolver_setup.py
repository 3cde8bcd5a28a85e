"""The resolver a gateway config describes, for the gateway and for `policy explain|test`."""

from __future__ import annotations

from sandgate.policy.resolver import (
    CachingResolver,
    ChainResolver,
    NameserverResolver,
    Resolver,
    StaticResolver,
    SystemResolver,
)
from sandgate.proxy.config import ResolverConfig

__all__ = ["build_resolver"]


def build_resolver(cfg: ResolverConfig) -> Resolver:
    """Static hosts first, then the nameservers (or the system), behind a TTL cache."""
    base: Resolver = (
        NameserverResolver(cfg.nameservers, timeout=cfg.timeout, ipv6=cfg.ipv6)
        if cfg.nameservers
        else SystemResolver(ttl=cfg.system_ttl)
    )
    if cfg.hosts:
        base = ChainResolver(StaticResolver(cfg.hosts), base)
    return CachingResolver(base, min_ttl=cfg.min_ttl, max_ttl=cfg.max_ttl)
