"""The stores' builder: the admin API's sandbox registry and the approvals' grants, in the
fleet's redis (through its one client) or in files under the state dir."""

from __future__ import annotations

from dataclasses import dataclass

from sandgate.proxy.approvals.grants import GrantStore, RedisGrants, StateFileGrants
from sandgate.proxy.config import GatewayConfig
from sandgate.proxy.fleet.registry_sync import FleetRegistrySync
from sandgate.proxy.stores.protocols import SandboxStore
from sandgate.proxy.stores.registry_file import FileSandboxStore
from sandgate.proxy.stores.registry_redis import RedisSandboxStore, rules_checker

__all__ = ["Stores", "build_stores"]


@dataclass(frozen=True)
class Stores:
    sandboxes: SandboxStore
    grants: GrantStore


def build_stores(config: GatewayConfig, fleet: FleetRegistrySync | None) -> Stores:
    """In redis with a fleet, else the registry file and `<state_dir>/grants.json`."""
    if fleet is not None and config.redis is not None:
        return Stores(
            RedisSandboxStore(fleet.client, fleet.keys, check=rules_checker(config.rules_path)),
            RedisGrants(fleet.client, config.redis.prefix),
        )
    return Stores(FileSandboxStore(config), StateFileGrants(config.state_path / "grants.json"))
