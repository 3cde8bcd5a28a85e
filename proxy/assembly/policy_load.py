"""The gateway's policy load: the rules directory plus the sandbox registries, and what each
load changes beside the policy it returns: the broker's credentials and the host rules."""

from __future__ import annotations

import asyncio
from pathlib import Path

import structlog

from sandgate.brokers import Broker
from sandgate.policy.errors import PolicySetError, SandgateError
from sandgate.policy.model.loader import load_policy_dir, policy_files
from sandgate.policy.model.policyset import PolicySet
from sandgate.proxy.config import GatewayConfig
from sandgate.proxy.fleet.registry_sync import FleetRegistrySync
from sandgate.proxy.refresh.reloader import RulesKeptError
from sandgate.proxy.sandboxes.registration import gateway_ports, interface_exists, sync_static_rules
from sandgate.proxy.startup.broker_setup import configure_broker
from sandgate.proxy.stores.registry import load_registry, merge_registry, merge_registry_lenient

__all__ = ["PolicyLoader"]

log = structlog.get_logger("sandgate.runtime")


class PolicyLoader:
    """Loads the policy (in a worker thread on reloads) and applies each load to the broker and,
    once the listeners are bound, to the host rules of the tenant files' interface sandboxes."""

    def __init__(self, config: GatewayConfig, broker: Broker) -> None:
        self.config = config
        self.broker = broker
        # The fleet's sandbox registry, merged from the first reload on (run() syncs it before serving).
        self.fleet: FleetRegistrySync | None = None
        # (transparent port, DNS port) of each worker once the listeners are bound: from then on
        # every load installs the host rules of the tenant files' interface sandboxes.
        self.host_ports: list[tuple[int, int]] | None = None
        # (version of the policy built from them, the rules): when the files stop loading, the
        # sandbox registry is merged onto these instead.
        self._rules_in_force: tuple[str, PolicySet] | None = None

    def load(self, previous: PolicySet | None = None) -> PolicySet:
        """The rules directory plus the dynamic sandbox registry.

        Isolated unless `strict_policy`: a broken tenant file keeps its last good version (the
        policy in force is passed as `previous`), and a registry entry whose tenant did not
        load is left out, so one tenant cannot stop the others' changes.
        """
        config, strict = self.config, self.config.strict_policy
        try:
            rules = load_policy_dir(config.rules_path, previous=previous, isolate=not strict)
            refused: PolicySetError | None = None
        except PolicySetError as e:
            kept = self._rules_in_force
            if previous is None or kept is None or kept[0] != previous.version:
                raise
            rules, refused = kept[1], e
        merged = self._merge_registries(rules)
        if self.host_ports is not None:
            # The tenant files' interface sandboxes get their host rules before their identity.
            self.sync_host_rules(merged)
        configure_broker(self.broker, merged)
        self._rules_in_force = (merged.version, rules)
        if refused is not None:
            # The files did not load; the registry still changes on the rules in force.
            raise RulesKeptError(merged, refused)
        return merged

    def _merge_registries(self, rules: PolicySet) -> PolicySet:
        """The rules plus the registry file's sandboxes, and the fleet's (redis) when there is one."""
        path = self.config.registry_path
        registry = load_registry(path)
        if self.config.strict_policy:
            merged = merge_registry(rules, registry, path)
        else:
            merged, rejected = merge_registry_lenient(rules, registry, str(path))
            if rejected:
                log.error("registry.entries_refused", source="file", errors=[str(e) for e in rejected])
        if self.fleet is not None:
            merged, rejected = merge_registry_lenient(
                merged, self.fleet.sandboxes(), "redis sandbox registry"
            )
            if rejected:
                log.error("registry.entries_refused", source="redis", errors=[str(e) for e in rejected])
        return merged

    def watched_files(self, policy: PolicySet) -> list[Path]:
        """The files a change of which reloads the policy."""
        return [
            *policy_files(self.config.rules_path),
            *map(Path, policy.token_files),
            *map(Path, policy.rego_files),
            self.config.registry_path,
        ]

    async def start_host_rules(self, policy: PolicySet, dns_port: int | None) -> bool:
        """At start: the host rules of the tenant files' interface sandboxes, installed again
        (a reboot empties nftables); False (do not serve) when they cannot be."""
        transparent = [lst.port for lst in self.config.listeners if lst.mode == "transparent"]
        if transparent and dns_port is not None:
            # Every worker writes the same table: all workers' ports, each interface steered to one.
            self.host_ports = gateway_ports(self.config, transparent[0], dns_port)
        try:
            await asyncio.to_thread(self.sync_host_rules, policy, force=True)
        except (SandgateError, RuntimeError, OSError) as e:
            log.error("host_rules.failed", error=str(e))
            return False
        return True

    def sync_host_rules(self, policy: PolicySet, *, force: bool = False) -> None:
        """Install the host rules of the tenant files' interface sandboxes (blocking: nft)."""
        extra = []
        if self.fleet is not None:
            extra = [s for s in self.fleet.sandboxes() if s.interface and interface_exists(s.interface)]
        sync_static_rules(self.config, policy, self.host_ports, extra, force=force)
