"""`sandgate credentials placeholders --sandbox ID`: what to put in a sandbox's environment."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from sandgate.brokers import Broker
from sandgate.policy.loader import load_policy_dir

from . import admin_cli
from .config import GatewayConfig, load_config
from .credentials import configure_broker
from .errors import ConfigError
from .placeholder_key import load_placeholder_key
from .registry import load_registry, merge_registry

__all__ = ["add_parsers", "placeholder_environment", "run_credentials_command"]


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    creds = sub.add_parser(
        "credentials", help="credential placeholders; values in the running gateway's store"
    )
    creds_sub = creds.add_subparsers(dest="credentials_command", required=True)
    ph = creds_sub.add_parser("placeholders", help="a sandbox's placeholders, as environment assignments")
    ph.add_argument("--sandbox", required=True)
    ph.add_argument("--config", type=Path)
    ph.add_argument("--format", choices=("env", "json"), default="env")
    admin_cli.add_credential_parsers(creds_sub)


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
    broker = Broker(placeholder_key=load_placeholder_key(config.placeholder_key_ref))
    configure_broker(broker, policy)
    placeholders = broker.placeholders(record.tenant, sandbox)
    return {env_name(c): placeholders[c.name] for c in tenant.credentials if c.name in placeholders}


def run_credentials_command(args: argparse.Namespace) -> int:
    if args.credentials_command in admin_cli.CREDENTIAL_COMMANDS:
        return admin_cli.run_credential_command(args)
    env = placeholder_environment(load_config(args.config), args.sandbox)
    if args.format == "json":
        print(json.dumps(env, indent=2))
    else:
        for name, value in env.items():
            print(f"{name}={value}")
    return 0
