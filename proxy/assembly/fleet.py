"""The fleet's builders: the registry sync and reload channel through redis, whose one client
the fleet's stores and the shared limit counts use too; without redis, the limit counts of
several workers go through their supervisor's limit relay."""

from __future__ import annotations

import redis.asyncio as aioredis

from sandgate.proxy.config import GatewayConfig, RedisConfig
from sandgate.proxy.context import GatewayContext
from sandgate.proxy.fleet.limits_sync import LimitSync, relay_limit_sync
from sandgate.proxy.fleet.registry_sync import FleetRegistrySync, default_gateway_id
from sandgate.proxy.redis.client import Keys
from sandgate.proxy.redis.outage import REDIS_OUTAGE
from sandgate.proxy.refresh.reloader import PolicyReloader

__all__ = ["build_fleet", "build_limit_sync", "fleet_gateway_id"]


def fleet_gateway_id(config: GatewayConfig, rcfg: RedisConfig) -> str:
    """This process's name in the fleet: the gateway's, and `-w<i>` for worker i of several."""
    return (rcfg.gateway_id or default_gateway_id(config.state_path)) + config.worker_suffix


def build_fleet(
    config: GatewayConfig, ctx: GatewayContext, reloader: PolicyReloader
) -> FleetRegistrySync | None:
    """The registry sync (None without `redis:`); its `client` is the fleet's one redis client."""
    rcfg = config.redis
    if rcfg is None:
        return None
    return FleetRegistrySync(
        rcfg,
        fleet_gateway_id(config, rcfg),
        reloader.reload,
        lambda: ctx.policy.version,
        poll_interval=rcfg.sync_interval_seconds,
        last_reload=reloader.report,
        epoch_file=config.fleet_epoch_path,
    )


def build_limit_sync(
    config: GatewayConfig, ctx: GatewayContext, fleet: FleetRegistrySync | None
) -> LimitSync | None:
    """Limit counts shared with the fleet (redis) or with this gateway's other workers; None when
    this process is the only one counting. Its `learn` runs before a new sandbox's decisions."""
    interval = config.limits_sync.interval_seconds
    if fleet is not None and config.redis is not None:
        # A handle on the fleet client's pool: its stop leaves the pool to the registry sync.
        client = aioredis.Redis(connection_pool=fleet.client.connection_pool)
        sync: LimitSync | None = LimitSync(
            ctx.limiter,
            client,
            Keys(config.redis.prefix),
            interval,
            gateway_id=fleet.gateway_id,
            outage=REDIS_OUTAGE,
        )
    else:
        sync = relay_limit_sync(ctx.limiter, interval, config.worker)
    if sync is not None:
        ctx.limit_learn = sync.learn
    return sync
