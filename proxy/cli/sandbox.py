"""`sandgate sandbox add|update|list|remove` and `sandgate jail`."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from sandgate.policy.errors import PolicySetError, TokenReferenceError
from sandgate.policy.model.sandbox_tokens import resolve_token_reference
from sandgate.proxy.admin import client as admin_client
from sandgate.proxy.cli.jail import run_jail
from sandgate.proxy.config import GatewayConfig, load_config
from sandgate.proxy.errors import ConfigError
from sandgate.proxy.fleet.channel import FleetKeys
from sandgate.proxy.redis.client import connect
from sandgate.proxy.sandboxes.registration import (
    apply_host_rules,
    interface_exists,
    register,
    registered,
    unregister,
)
from sandgate.proxy.sandboxes.sandbox_listing import load_error_text, rows_from_files, sandboxes_text
from sandgate.proxy.stores.protocols import StoreError
from sandgate.proxy.stores.registry import DynamicSandbox
from sandgate.proxy.stores.registry_redis import RedisSandboxStore, rules_checker

__all__ = ["run_jail_command", "run_sandbox_command"]


def run_sandbox_command(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    if args.sandbox_command == "list":
        return _list(config, args.format)
    if admin_client.gateway_running(config):
        # The running gateway registers (and reloads) itself: its store may be redis, not the file.
        return _through_api(config, args)
    if args.sandbox_command == "update" or (args.sandbox_command == "add" and args.replace):
        return _update_local(config, args)
    if args.sandbox_command == "add":
        sandbox = _sandbox_from_args(args)
        if config.redis is not None:
            _fleet_add(config, sandbox)
        else:
            register(config, sandbox)
        where = f" on {sandbox.interface}" if sandbox.interface else ""
        source = f" from {', '.join(sandbox.addresses)}" if sandbox.addresses else ""
        token = " with a proxy token" if sandbox.token else ""
        print(f"registered {sandbox.id} (tenant {sandbox.tenant}){where}{source}{token}")
        return 0
    if args.sandbox_command == "remove":
        removed = _fleet_remove(config, args.id) if config.redis is not None else unregister(config, args.id)
        if removed is None:
            print(f"sandgate: no registered sandbox {args.id!r}", file=sys.stderr)
            return 2
        print(f"removed {removed.id}")
        return 0
    raise AssertionError(f"unknown sandbox command {args.sandbox_command!r}")


def _list(config: GatewayConfig, fmt: str) -> int:
    """Every sandbox the running gateway serves (tenant files and registry alike); without a
    gateway, what one started now would serve, from the files (and redis)."""
    notes: list[str] = []
    if admin_client.gateway_running(config):
        rows = list(admin_client.status(config)["sandbox_list"])
    else:
        fleet = _fleet_list(config) if config.redis is not None else None
        try:
            rows, notes = rows_from_files(config, fleet)
        except PolicySetError as e:
            print(f"sandgate: {load_error_text(e)}", file=sys.stderr)
            return 2
        notes.insert(0, f"no gateway is running: listed from {config.rules_path} and the registry")
    print(json.dumps(rows, indent=2) if fmt == "json" else sandboxes_text(rows))
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    return 0


def _through_api(config: GatewayConfig, args: argparse.Namespace) -> int:
    if args.sandbox_command == "update" or (args.sandbox_command == "add" and args.replace):
        return _update_through_api(config, args)
    if args.sandbox_command == "add":
        sandbox = _sandbox_from_args(args)
        entry = sandbox.model_dump(exclude_none=True)
        if config.redis is not None and sandbox.interface:
            # A fleet gateway's store is redis: this host's rules are this command's to install.
            current = [DynamicSandbox.model_validate(e) for e in admin_client.list_sandboxes(config)]
            result = _rules_first(config, sandbox, current, lambda: admin_client.add_sandbox(config, entry))
        else:
            result = admin_client.add_sandbox(config, entry)
        print(
            f"registered {entry['id']} (tenant {entry['tenant']}); policy version {result['policy_version']}"
        )
        return 0
    if args.sandbox_command == "remove":
        try:
            admin_client.remove_sandbox(config, args.id)
        except admin_client.AdminApiError as e:
            if e.status != 404:
                raise
            print(f"sandgate: no registered sandbox {args.id!r}", file=sys.stderr)
            return 2
        print(f"removed {args.id}")
        return 0
    raise AssertionError(f"unknown sandbox command {args.sandbox_command!r}")


def _update_through_api(config: GatewayConfig, args: argparse.Namespace) -> int:
    current = [DynamicSandbox.model_validate(e) for e in admin_client.list_sandboxes(config)]
    sandbox, previous = _updated(args, current)
    if previous is None:
        return _through_api(config, _as_add(args))
    entry = sandbox.model_dump(exclude_none=True)
    moved = (previous.interface, previous.addresses) != (sandbox.interface, sandbox.addresses)
    if config.redis is not None and moved and (sandbox.interface or previous.interface):
        # A fleet gateway's store is redis: this host's rules are this command's to install.
        result = _rules_first(config, sandbox, current, lambda: admin_client.update_sandbox(config, entry))
    else:
        result = admin_client.update_sandbox(config, entry)
    changed = ", ".join(result.get("changed", [])) or "nothing"
    version = result["policy_version"]
    print(f"updated {sandbox.id} (tenant {sandbox.tenant}; changed: {changed}); policy version {version}")
    return 0


def _update_local(config: GatewayConfig, args: argparse.Namespace) -> int:
    """`update` / `add --replace` with no gateway running: the registry file, or redis."""
    current = _fleet_list(config) if config.redis is not None else registered(config)
    sandbox, previous = _updated(args, current)
    if previous is None:
        return run_sandbox_command(_as_add(args))
    if config.redis is None:
        register(config, sandbox, replace=True)
    else:
        moved = (previous.interface, previous.addresses) != (sandbox.interface, sandbox.addresses)

        def replace() -> DynamicSandbox | None:
            async def work() -> DynamicSandbox | None:
                store = _fleet_store(config)
                try:
                    return await store.replace(sandbox)
                finally:
                    await store.client.aclose()

            return _run_store(work())

        if moved and (sandbox.interface or previous.interface):
            _rules_first(config, sandbox, current, replace)
        else:
            replace()
    print(f"updated {sandbox.id} (tenant {sandbox.tenant})")
    return 0


def _updated(
    args: argparse.Namespace, current: list[DynamicSandbox]
) -> tuple[DynamicSandbox, DynamicSandbox | None]:
    """(the entry to write, the registered one it replaces or None). `update` changes only the
    options given; `add --replace` writes exactly what its options say."""
    if args.sandbox_command == "add":
        sandbox = _sandbox_from_args(args)
        return sandbox, next((s for s in current if s.id == sandbox.id), None)
    previous = next((s for s in current if s.id == args.id), None)
    if previous is None:
        raise ConfigError(
            f"sandbox update: no registered sandbox {args.id!r} (tenant-file sandboxes change in their file)"
        )
    changes: dict[str, object] = {}
    if args.tenant:
        changes["tenant"] = args.tenant
    if args.interface:
        changes["interface"] = args.interface
    if args.address:
        changes["addresses"] = tuple(args.address)
    if args.token:
        changes["token"] = _token_digest(args.token, "sandbox update")
    if not changes:
        raise ConfigError("sandbox update: give at least one of --tenant, --interface, --address, --token")
    try:
        return DynamicSandbox.model_validate({**previous.model_dump(), **changes}), previous
    except ValidationError as e:
        raise ConfigError(f"sandbox update: {_problems(e)}") from None


def _as_add(args: argparse.Namespace) -> argparse.Namespace:
    """`add --replace` of an id not registered yet: a plain add."""
    return argparse.Namespace(**{**vars(args), "replace": False})


def _token_digest(ref: str, command: str) -> str:
    try:
        return "sha256:" + resolve_token_reference(ref, Path.cwd()).hex()
    except TokenReferenceError as e:
        raise ConfigError(f"{command} --token: {e}") from None


def _problems(e: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, x['loc'])) or 'sandbox'}: {x['msg']}" for x in e.errors())


def _sandbox_from_args(args: argparse.Namespace) -> DynamicSandbox:
    if not (args.id or args.interface):
        raise ConfigError("sandbox add: give --id (or --interface, whose name is the default id)")
    token = _token_digest(args.token, "sandbox add") if args.token else None
    try:
        return DynamicSandbox(
            id=args.id or args.interface.lower(),
            tenant=args.tenant,
            interface=args.interface,
            addresses=tuple(args.address),
            token=token,
        )
    except ValidationError as e:
        raise ConfigError(f"sandbox add: {_problems(e)}") from None


def _fleet_store(config: GatewayConfig) -> RedisSandboxStore:
    assert config.redis is not None
    return RedisSandboxStore(
        connect(config.redis),
        FleetKeys.for_prefix(config.redis.prefix),
        check=rules_checker(config.rules_path),
    )


def _fleet_add(config: GatewayConfig, sandbox: DynamicSandbox) -> None:
    """Install host rules for the sandboxes on this host's interfaces, then register in redis."""

    async def run[T](work: Callable[[RedisSandboxStore], Awaitable[T]]) -> T:
        store = _fleet_store(config)
        try:
            return await work(store)
        finally:
            await store.client.aclose()

    if not sandbox.interface:
        _run_store(run(lambda store: store.add(sandbox)))
        return
    current = _run_store(run(lambda store: store.list()))
    _rules_first(config, sandbox, current, lambda: _run_store(run(lambda store: store.add(sandbox))))


def _rules_first[R](
    config: GatewayConfig, sandbox: DynamicSandbox, current: list[DynamicSandbox], add: Callable[[], R]
) -> R:
    """Anti-spoofing rules for the new interface before its address means an identity anywhere
    (one nft transaction, also for an update that moves a sandbox); when registering fails, the
    rules go back to what they were."""
    others = [s for s in current if s.id != sandbox.id]
    apply_host_rules(config, [*others, sandbox, *registered(config)])
    try:
        return add()
    except BaseException:
        apply_host_rules(config, [*current, *registered(config)])
        raise


def _fleet_list(config: GatewayConfig) -> list[DynamicSandbox]:
    async def list_() -> list[DynamicSandbox]:
        store = _fleet_store(config)
        try:
            return await store.list()
        finally:
            await store.client.aclose()

    return _run_store(list_())


def _fleet_remove(config: GatewayConfig, sandbox_id: str) -> DynamicSandbox | None:
    async def remove() -> tuple[DynamicSandbox | None, list[DynamicSandbox]]:
        store = _fleet_store(config)
        try:
            found = next((s for s in await store.list() if s.id == sandbox_id), None)
            if found is None or not await store.remove(sandbox_id):
                return None, []
            return found, await store.list()
        finally:
            await store.client.aclose()

    removed, remaining = _run_store(remove())
    if removed is not None and removed.interface and interface_exists(removed.interface):
        apply_host_rules(config, [*remaining, *registered(config)])
    return removed


def _run_store[T](work: Coroutine[Any, Any, T]) -> T:
    try:
        return asyncio.run(work)
    except StoreError as e:
        raise ConfigError(str(e)) from None


def run_jail_command(args: argparse.Namespace) -> int:
    command = list(args.argv)
    if command[:1] == ["--"]:
        command = command[1:]
    return run_jail(load_config(args.config), command, tenant=args.tenant, sandbox=args.sandbox)
