"""`sandgate sandbox add|list|remove` and `sandgate jail`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import admin_client
from .config import GatewayConfig, load_config
from .jail import run_jail
from .registry import DynamicSandbox
from .sandboxes import register, registered, unregister

__all__ = ["add_parsers", "run_jail_command", "run_sandbox_command"]


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `sandbox` and `jail` subcommands."""
    sb = sub.add_parser("sandbox", help="register sandboxes and their host rules (needs root)")
    sb_sub = sb.add_subparsers(dest="sandbox_command", required=True)
    add = sb_sub.add_parser("add", help="register a sandbox on a host interface and install its rules")
    add.add_argument(
        "--interface", required=True, help="the host-side interface (TAP or veth) of the sandbox"
    )
    add.add_argument("--address", required=True, help="the sandbox's only valid source address")
    add.add_argument("--tenant", required=True)
    add.add_argument("--id", help="sandbox id (default: the interface name)")
    add.add_argument("--config", type=Path)
    rm = sb_sub.add_parser("remove", help="unregister a sandbox and remove its rules")
    rm.add_argument("id")
    rm.add_argument("--config", type=Path)
    ls = sb_sub.add_parser("list", help="list registered sandboxes")
    ls.add_argument("--config", type=Path)
    ls.add_argument("--format", choices=("text", "json"), default="text")

    jail = sub.add_parser(
        "jail", help="run a command in a fresh network namespace behind the gateway (needs root)"
    )
    jail.add_argument("--tenant")
    jail.add_argument("--sandbox", help="sandbox id (default: jail-<random>)")
    jail.add_argument("--config", type=Path)
    jail.add_argument(
        "argv", nargs=argparse.REMAINDER, metavar="-- COMMAND", help="the command to run, after --"
    )


def run_sandbox_command(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    if admin_client.gateway_running(config):
        # The running gateway registers (and reloads) itself: its store may be redis, not the file.
        return _through_api(config, args)
    if args.sandbox_command == "add":
        sandbox = DynamicSandbox(
            id=args.id or args.interface.lower(),
            tenant=args.tenant,
            interface=args.interface,
            address=args.address,
        )
        register(config, sandbox)
        print(
            f"registered {sandbox.id} (tenant {sandbox.tenant}) on {sandbox.interface} from {sandbox.address}"
        )
        return 0
    if args.sandbox_command == "remove":
        removed = unregister(config, args.id)
        if removed is None:
            print(f"sandgate: no registered sandbox {args.id!r}", file=sys.stderr)
            return 2
        print(f"removed {removed.id}")
        return 0
    entries = registered(config)
    if args.format == "json":
        print(json.dumps([s.model_dump() for s in entries], indent=2))
    else:
        for s in entries:
            print(f"{s.id}\t{s.tenant}\t{s.interface or '-'}\t{s.address}")
    return 0


def _through_api(config: GatewayConfig, args: argparse.Namespace) -> int:
    if args.sandbox_command == "add":
        entry = {
            "id": args.id or args.interface.lower(),
            "tenant": args.tenant,
            "interface": args.interface,
            "address": args.address,
        }
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
    entries = admin_client.list_sandboxes(config)
    if args.format == "json":
        print(json.dumps(entries, indent=2))
    else:
        for s in entries:
            print(f"{s['id']}\t{s['tenant']}\t{s['interface'] or '-'}\t{s['address']}")
    return 0


def run_jail_command(args: argparse.Namespace) -> int:
    command = list(args.argv)
    if command[:1] == ["--"]:
        command = command[1:]
    return run_jail(load_config(args.config), command, tenant=args.tenant, sandbox=args.sandbox)
