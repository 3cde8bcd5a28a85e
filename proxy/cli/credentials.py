"""`sandgate credentials ...`: a sandbox's placeholders, and the stored credential values.

`placeholders --sandbox ID` prints what to put in a sandbox's environment. `set`, `rotate`,
`remove`, `list`, `rekey` and `add-key` work on the credential store (redis when `redis:` is
configured, else the local sealed file); a value is read from stdin or an environment
variable, never from the command line, and is never printed back.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import os
import re
import sys
from dataclasses import asdict

from sandgate.brokers import Broker, Secret
from sandgate.policy.model.loader import load_policy_dir
from sandgate.proxy.admin.client import AdminApiError, ApiCredentialStore, gateway_running
from sandgate.proxy.config import GatewayConfig, load_config
from sandgate.proxy.errors import ConfigError
from sandgate.proxy.startup.broker_setup import configure_broker
from sandgate.proxy.stores.credentials import RekeyableStore
from sandgate.proxy.stores.credentials_factory import open_credential_store, stored_secrets
from sandgate.proxy.stores.placeholder_key import load_placeholder_key
from sandgate.proxy.stores.protocols import CredentialInfo, StoreError
from sandgate.proxy.stores.registry import load_registry, merge_registry
from sandgate.proxy.stores.sealing_keys import StoreKeys

__all__ = ["placeholder_environment", "run_credentials_command"]


def env_name(credential: object) -> str:
    """The guest variable for a credential: its `env`, else SANDGATE_<NAME>."""
    explicit = getattr(credential, "env", None)
    if explicit:
        return str(explicit)
    return "SANDGATE_" + re.sub(r"[^A-Za-z0-9]", "_", str(getattr(credential, "name", ""))).upper()


def placeholder_environment(config: GatewayConfig, sandbox: str) -> dict[str, str]:
    """Variable name → placeholder for every credential of the sandbox's tenant."""
    policy = merge_registry(
        load_policy_dir(config.rules_path), load_registry(config.registry_path), config.registry_path
    )
    record = policy.sandboxes.get(sandbox)
    if record is None:
        raise ConfigError(f"unknown sandbox {sandbox!r}")
    tenant = policy.tenants[record.tenant]
    _, _, secrets = stored_secrets(config)  # `stored:` references are valid; nothing is read
    broker = Broker(placeholder_key=load_placeholder_key(config.placeholder_key_ref), secrets=secrets)
    configure_broker(broker, policy)
    placeholders = broker.placeholders(record.tenant, sandbox)
    return {env_name(c): placeholders[c.name] for c in tenant.credentials if c.name in placeholders}


def read_value(from_env: str | None) -> Secret:
    """The value to store: from an environment variable, a no-echo prompt on a terminal, or stdin."""
    if from_env:
        text = os.environ.get(from_env, "")
        if not text.strip():
            raise ConfigError(f"environment variable {from_env} is not set or empty")
    elif sys.stdin.isatty():
        text = getpass.getpass("value (not echoed): ")
    else:
        text = sys.stdin.read()
    value = text.strip()  # a trailing newline from `echo` or a file is not part of a key
    if not value:
        raise ConfigError("the credential value is empty")
    return Secret(value)


async def store_command(store: RekeyableStore, args: argparse.Namespace) -> int:
    """One store operation, thin over the CredentialStore protocol (an admin API client can do the same)."""
    try:
        command = args.credentials_command
        if command in ("set", "rotate"):
            info = await store.put(
                args.tenant, args.name, read_value(args.from_env), must_exist=command == "rotate"
            )
            print(f"{info.tenant}/{info.name}: version {info.version}, updated {info.updated}")
        elif command == "remove":
            if not await store.remove(args.tenant, args.name):
                print(f"sandgate: credential {args.name} of tenant {args.tenant} is not set", file=sys.stderr)
                return 1
            print(f"{args.tenant}/{args.name}: removed")
        elif command == "list":
            _print_infos(await store.list(args.tenant), args.format)
        elif command == "rekey":
            count = await store.rekey()
            print(f"re-sealed {count} stored value(s) with the newest key")
        return 0
    finally:
        await store.aclose()


def _print_infos(infos: list[CredentialInfo], fmt: str) -> None:
    if fmt == "json":
        print(json.dumps([asdict(i) for i in infos], indent=2))
        return
    rows = [("TENANT", "NAME", "VERSION", "UPDATED")] + [
        (i.tenant, i.name, str(i.version), i.updated) for i in infos
    ]
    widths = [max(len(r[c]) for r in rows) for c in range(4)]
    for row in rows:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())


def run_credentials_command(args: argparse.Namespace) -> int:
    if args.credentials_command == "placeholders":
        return _placeholders(args)
    config = load_config(args.config)
    if args.credentials_command == "add-key":
        keys = StoreKeys(config.store_keys_ref, create=True)
        print(f"added store key {keys.add_key()} to {keys.path}; new values are sealed with it")
        if config.redis is not None:
            print("copy the key file to every gateway of the fleet, then run `sandgate credentials rekey`")
        return 0
    # A running gateway's store is reached through its admin API (a fleet's store is redis,
    # reachable either way); `rekey` always works on the store itself.
    store: RekeyableStore = (
        ApiCredentialStore(config)
        if args.credentials_command != "rekey" and gateway_running(config)
        else open_credential_store(config)
    )
    try:
        return asyncio.run(store_command(store, args))
    except (StoreError, AdminApiError) as e:
        print(f"sandgate: {e}", file=sys.stderr)
        return 2


def _placeholders(args: argparse.Namespace) -> int:
    env = placeholder_environment(load_config(args.config), args.sandbox)
    if args.format == "json":
        print(json.dumps(env, indent=2))
    else:
        for name, value in env.items():
            print(f"{name}={value}")
    return 0
