"""Registering sandboxes at run time: the registry entry and the host rules, together.

`register` and `unregister` update `<state_dir>/sandboxes.json` and rewrite sandgate's
nftables table for every registered interface; the running gateway picks the registry up
on its next reload (it watches the file). Both are idempotent. The table also carries the
tenant files' interface sandboxes, which the gateway installs (`sync_static_rules`) and
records in `<state_dir>/static-sandboxes.json` for every later rewrite.
"""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import structlog

from sandgate.policy.model.loader import load_policy_dir
from sandgate.policy.model.policyset import PolicySet
from sandgate.proxy.config import GatewayConfig
from sandgate.proxy.errors import ConfigError
from sandgate.proxy.net.host_table import LEGACY_TABLE, check_owner, legacy_sources, owner_comment
from sandgate.proxy.net.nft import (
    Ports,
    SandboxInterface,
    apply_ruleset,
    enable_ipv6,
    set_interface_sysctls,
    worker_ports,
)
from sandgate.proxy.net.static_sandboxes import StaticSandbox, desired_static, load_static, save_static
from sandgate.proxy.state.statusfile import read_status
from sandgate.proxy.stores.registry import (
    DynamicSandbox,
    already_registered,
    load_registry,
    merge_registry,
    save_registry,
)

__all__ = [
    "SandboxExists",
    "apply_host_rules",
    "gateway_ports",
    "interface_exists",
    "listener_ports",
    "prepare_host_table",
    "register",
    "registered",
    "static_path",
    "steered_ports",
    "sync_static_rules",
    "unregister",
]

log = structlog.get_logger("sandgate.sandboxes")


def listener_ports(config: GatewayConfig) -> list[Ports]:
    """(transparent port, DNS port) of each worker of the running gateway (index = worker), else
    of the config."""
    status = read_status(config.status_path) or {}
    transparent = status.get("transparent_port") or next(
        (_base(config, lst.port) for lst in config.listeners if lst.mode == "transparent"), None
    )
    dns = status.get("dns_port") or (_base(config, config.dns.port) if config.dns else None)
    if not transparent or not dns:
        raise ConfigError("the gateway config needs a transparent listener and a dns listener for sandboxes")
    # The gateway's status file says how many workers serve (the supervisor writes it); a worker
    # reads its own, and knows from its config.
    count = int(status.get("workers") or _count(config, running=bool(status)))
    return steered_ports(config, int(transparent), int(dns), count)


def steered_ports(config: GatewayConfig, transparent: int, dns: int, count: int) -> list[Ports]:
    """The ports the host rules steer to, from the lead's: base + i for worker i when the config
    gives both the transparent and the DNS listener fixed ports; otherwise every interface goes
    to the one pair given, the lead's (listeners opened on demand exist on the lead only, and
    port 0, any free port, has no base + i)."""
    if count > 1 and _fixed_ports(config):
        return worker_ports(transparent, dns, count)
    return [(transparent, dns)]


def gateway_ports(config: GatewayConfig, transparent: int, dns: int) -> list[Ports]:
    """The ports the host rules steer to, as a gateway process knows them from its own bound
    transparent and DNS ports: every worker computes the same list (its own ports are base +
    its index), so whichever installs the rules writes the same table."""
    index = _index(config) if _fixed_ports(config) else 0
    return steered_ports(config, transparent - index, dns - index, _count(config, running=True))


def _fixed_ports(config: GatewayConfig) -> bool:
    transparent = any(lst.mode == "transparent" and lst.port for lst in config.listeners)
    return transparent and config.dns is not None and bool(config.dns.port)


def _index(config: GatewayConfig) -> int:
    """This process's worker index (a worker's config has its own ports: base + index)."""
    return config.worker.index


def _base(config: GatewayConfig, port: int) -> int:
    """The lead's port, from a config's (a worker's has its own: base + its index)."""
    return port - _index(config) if port else 0


def _count(config: GatewayConfig, *, running: bool) -> int:
    """How many workers the config's gateway runs: a worker's config knows; without a running
    gateway, the count its config gives (else 1: the gateway steers again when it starts)."""
    if config.worker.count > 1 or running:
        return config.worker.count
    return config.workers.count if isinstance(config.workers.count, int) else 1


@contextmanager
def _locked(config: GatewayConfig) -> Iterator[None]:
    """One registry writer at a time (several jails may start at once)."""
    lock = config.state_path / ".registry.lock"
    lock.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with lock.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def registered(config: GatewayConfig) -> list[DynamicSandbox]:
    """The dynamically registered sandboxes."""
    return load_registry(config.registry_path)


class SandboxExists(ConfigError):
    """`add` of an id that is registered with other settings (`update` changes it)."""

    def __init__(self, existing: DynamicSandbox) -> None:
        super().__init__(already_registered(existing))
        self.existing = existing


def register(
    config: GatewayConfig, sandbox: DynamicSandbox, *, apply_rules: bool = True, replace: bool = False
) -> DynamicSandbox | None:
    """Add a sandbox and install the host rules for its interface; returns the entry it replaced.

    An identical entry is a no-op; an entry of the same id with other settings is refused
    (SandboxExists) unless `replace`. A replacement is one registry write and, when its
    interface or address changed, one nft transaction: the gateway swaps identities on its
    next reload in one step, so the sandbox is never unidentified in between.
    """
    with _locked(config):
        registry = load_registry(config.registry_path)
        previous = next((s for s in registry if s.id == sandbox.id), None)
        if previous == sandbox:
            return previous
        if previous is not None and not replace:
            raise SandboxExists(previous)
        updated = [*(s for s in registry if s.id != sandbox.id), sandbox]
        # Refuse what the gateway would refuse: unknown tenant, a taken id or address.
        merge_registry(load_policy_dir(config.rules_path), updated, config.registry_path)
        moved = previous is None or (previous.interface, previous.addresses) != (
            sandbox.interface,
            sandbox.addresses,
        )
        if apply_rules and moved and (sandbox.interface or (previous and previous.interface)):
            if sandbox.interface:
                _sysctls_before(sandbox)
            # One nft transaction: when nft refuses, the old rules and the registry stay as they were.
            _apply(config, updated)
            if sandbox.interface:
                _sysctls_after(sandbox)
        save_registry(config.registry_path, updated)
        return previous


def unregister(config: GatewayConfig, sandbox_id: str, *, apply_rules: bool = True) -> DynamicSandbox | None:
    """Remove a sandbox and its host rules; returns what was removed (None: nothing was)."""
    with _locked(config):
        current = load_registry(config.registry_path)
        removed = next((s for s in current if s.id == sandbox_id), None)
        remaining = [s for s in current if s.id != sandbox_id]
        save_registry(config.registry_path, remaining)
        if apply_rules:
            _apply(config, remaining)
        return removed


def interface_exists(name: str) -> bool:
    """Whether a network interface of this name exists on this host."""
    return Path("/sys/class/net", name).exists()


def apply_host_rules(config: GatewayConfig, sandboxes: list[DynamicSandbox]) -> None:
    """Rewrite sandgate's nftables table for those of `sandboxes` whose interface is on this host
    (a fleet registry also lists sandboxes on other hosts)."""
    local = [s for s in sandboxes if s.interface and interface_exists(s.interface)]
    with _locked(config):
        for s in local:
            _sysctls_before(s)
        _apply(config, local)
        for s in local:
            _sysctls_after(s)


def _has_ipv6(sandbox: DynamicSandbox | StaticSandbox) -> bool:
    return any(":" in a for a in sandbox.addresses)


def _sysctls_before(sandbox: DynamicSandbox) -> None:
    """What only tightens (rp_filter; no IPv6 without an IPv6 address) goes before the rules."""
    assert sandbox.interface is not None
    set_interface_sysctls(sandbox.interface, ipv6=_has_ipv6(sandbox))


def _sysctls_after(sandbox: DynamicSandbox) -> None:
    """What opens (IPv6 on the interface) only once the rules guarding it are in force."""
    assert sandbox.interface is not None
    if _has_ipv6(sandbox):
        enable_ipv6(sandbox.interface)


def prepare_host_table(config: GatewayConfig) -> None:
    """At start: refuse a table another running gateway owns, and move this state_dir's rules
    out of the `inet sandgate` table an older sandgate shared between gateways (net/host_table.py)."""
    table = config.nft_table
    check_owner(table, config.state_path)
    if config.host_rules.table is not None:
        return  # named explicitly: no derived name to move to
    old = legacy_sources()
    if old is None:
        return
    local = [s for s in registered(config) if s.interface and interface_exists(s.interface)]
    mine = {(s.interface, a) for s in local for a in s.addresses}
    if not old or not old <= mine:
        log.warning("host_rules.legacy_table_left", table=LEGACY_TABLE, reason="not this state_dir's rules")
        return
    with _locked(config):
        _apply(config, local, drop_table=LEGACY_TABLE)
    log.info("host_rules.legacy_table_moved", old=LEGACY_TABLE, table=table)


def static_path(config: GatewayConfig) -> Path:
    """Where the gateway records the tenant files' interface sandboxes it installed."""
    return config.state_path / "static-sandboxes.json"


def sync_static_rules(
    config: GatewayConfig,
    policy: PolicySet,
    ports: list[Ports] | None,
    extra: list[DynamicSandbox],
    *,
    force: bool = False,
) -> list[StaticSandbox]:
    """Install the host rules for the tenant files' interface sandboxes of `policy`, beside the
    registry's (and `extra`: a fleet registry's on this host), when they changed (or `force`:
    at start, when any interface is registered). Raises (and changes nothing) when they cannot
    be installed."""
    with _locked(config):
        installed = load_static(static_path(config))
        wanted = desired_static(policy, installed)
        registry = [*load_registry(config.registry_path), *extra]
        # At start the whole table is written again, the registry's sandboxes included: a reboot
        # emptied nftables, and the rules must steer to the workers that serve now (a `sandbox
        # add` without a running gateway could not know how many would).
        steer = ports is not None and any(s.interface for s in registry)
        if wanted == installed and not (force and (wanted or steer)):
            return wanted
        if wanted and ports is None:
            first = wanted[0]
            raise ConfigError(
                f"{first.file}: sandbox {first.id!r} is on interface {first.interface}: the gateway "
                "config needs a transparent listener and a dns listener"
            )
        # A TAP that does not exist yet gets its nft rules now (they match by name) and its
        # sysctls at the first start or reload that finds it.
        present = [s for s in wanted if interface_exists(s.interface)]
        for s in present:
            set_interface_sysctls(s.interface, ipv6=_has_ipv6(s))
        _apply(config, registry, static=wanted, ports=ports)
        for s in present:
            if _has_ipv6(s):
                enable_ipv6(s.interface)  # only once the rules guarding it are in force
        save_static(static_path(config), wanted)
        log.info("host_rules.static_installed", sandboxes=[s.id for s in wanted], workers=len(ports or ()))
        return wanted


def _apply(
    config: GatewayConfig,
    sandboxes: list[DynamicSandbox],
    *,
    static: list[StaticSandbox] | None = None,
    ports: list[Ports] | None = None,
    drop_table: str | None = None,
) -> None:
    """Rewrite the table: the tenant files' interface sandboxes (those the gateway last
    installed, unless given), then the registry's that do not clash with them."""
    static = load_static(static_path(config)) if static is None else static
    interfaces = [SandboxInterface(s.interface, s.addresses) for s in static]
    taken = {s.interface for s in static} | {a for s in static for a in s.addresses}
    for s in sandboxes:
        if not (s.interface and s.addresses) or s.interface in taken:
            continue
        if taken.intersection(s.addresses):
            # A registered sandbox whose address a tenant file claims keeps no source address,
            # but its interface stays guarded: everything from it is dropped, never routed around.
            log.warning("host_rules.registered_sandbox_shut", sandbox=s.id, interface=s.interface)
            interfaces.append(SandboxInterface(s.interface, ()))
        else:
            interfaces.append(SandboxInterface(s.interface, s.addresses))
    table = config.nft_table
    # Never write (nor delete) a table another running gateway owns.
    check_owner(table, config.state_path)
    if not interfaces:
        ports = [(0, 0)]
    ports = ports or listener_ports(config)
    apply_ruleset(interfaces, ports, table, comment=owner_comment(config.state_path), drop_table=drop_table)
