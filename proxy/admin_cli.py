"""CLI commands that act on the running gateway through its admin API.

`sandgate policy reload|status` and `sandgate credentials set|rotate|remove|list`. A
credential value is read from standard input (never from the command line, where `ps`
would show it) and is never printed.
"""

from __future__ import annotations

import argparse
import getpass
import json
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sandgate.brokers import Secret

from . import admin_client
from .config import GatewayConfig, load_config
from .errors import ConfigError

__all__ = [
    "CREDENTIAL_COMMANDS",
    "POLICY_COMMANDS",
    "add_credential_parsers",
    "add_policy_parsers",
    "run_credential_command",
    "run_policy_command",
]

POLICY_COMMANDS = ("reload", "status")
CREDENTIAL_COMMANDS = ("set", "rotate", "remove", "list")


def add_policy_parsers(pol_sub: Any, fmt: Callable[[argparse.ArgumentParser], None]) -> None:
    """`policy reload` and `policy status` (the running gateway's)."""
    reload = pol_sub.add_parser("reload", help="reload the running gateway's policy now")
    reload.add_argument("--config", type=Path)
    fmt(reload)
    status = pol_sub.add_parser("status", help="the running gateway's policy version, listeners, reloads")
    status.add_argument("--config", type=Path)
    fmt(status)


def run_policy_command(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    if args.policy_command == "reload":
        result = admin_client.reload_policy(config)
        _emit(args.format, result, f"reloaded: policy version {result['policy_version']}")
        return 0
    st = admin_client.status(config)
    last = st.get("last_reload")
    lines = [
        f"gateway {st['gateway_id']} (pid {st['pid']}), {'ready' if st['ready'] else 'NOT ready'}",
        f"policy version {st['policy_version']}: {st['tenants']} tenants, {st['sandboxes']} sandboxes",
        f"listeners: {', '.join(st['listeners']) or '-'}",
        f"reload failures: {st['reload_failures']}; audit queue: {st['audit_queue_depth']}",
    ]
    if last is not None:
        when = datetime.fromtimestamp(last["time"], UTC).isoformat(timespec="seconds")
        lines.append(f"last reload: {'ok' if last['ok'] else 'FAILED'} ({last['trigger']}, {when})")
        lines.extend(f"  {e}" for e in last["errors"])
    _emit(args.format, st, "\n".join(lines))
    return 0


def add_credential_parsers(creds_sub: Any) -> None:
    """`credentials set|rotate|remove|list` against the running gateway's credential store."""
    for name, help_ in (
        ("set", "add or replace a credential value (read from stdin)"),
        ("rotate", "replace an existing credential value (read from stdin)"),
    ):
        p = creds_sub.add_parser(name, help=help_)
        p.add_argument("tenant")
        p.add_argument("name")
        p.add_argument("--config", type=Path)
    rm = creds_sub.add_parser("remove", help="remove a credential value")
    rm.add_argument("tenant")
    rm.add_argument("name")
    rm.add_argument("--config", type=Path)
    ls = creds_sub.add_parser("list", help="stored credentials (names and versions, never values)")
    ls.add_argument("--tenant")
    ls.add_argument("--config", type=Path)
    ls.add_argument("--format", choices=("text", "json"), default="text")


def run_credential_command(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    command = args.credentials_command
    if command == "list":
        entries = admin_client.list_credentials(config, args.tenant)
        if args.format == "json":
            print(json.dumps(entries, indent=2))
        else:
            for e in entries:
                print(f"{e['tenant']}\t{e['name']}\tv{e['version']}\t{e['updated']}")
        return 0
    if command == "remove":
        admin_client.remove_credential(config, args.tenant, args.name)
        print(f"removed {args.tenant}/{args.name}")
        return 0
    if command == "rotate" and not _exists(config, args.tenant, args.name):
        raise ConfigError(f"no credential {args.name!r} for tenant {args.tenant!r} to rotate; use `set`")
    info = admin_client.set_credential(config, args.tenant, args.name, _read_value())
    print(f"{args.tenant}/{args.name}: version {info['version']}")
    return 0


def _exists(config: GatewayConfig, tenant: str, name: str) -> bool:
    return any(e["name"] == name for e in admin_client.list_credentials(config, tenant))


def _read_value() -> Secret:
    """The value from a terminal prompt (not echoed) or one line of standard input."""
    text = getpass.getpass("value: ") if sys.stdin.isatty() else sys.stdin.readline().rstrip("\r\n")
    if not text:
        raise ConfigError("no value given on standard input")
    return Secret(text)


def _emit(fmt: str, value: dict[str, Any], text: str) -> None:
    print(json.dumps(value, indent=2) if fmt == "json" else text)
