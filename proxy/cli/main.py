"""The `sandgate` command.

Exit codes: 0 ok, 1 policy test failure or denied explain, a listener that cannot start, or
a gateway that does not serve (`status`), 2 usage or invalid input.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from sandgate.policy.errors import PolicyLoadError, PolicySetError, SandgateError
from sandgate.policy.model.sandbox_tokens import digest_token, new_token
from sandgate.proxy.ca import export_ca, init_ca
from sandgate.proxy.cli import audit as audit_cli
from sandgate.proxy.cli import credentials as credentials_cli
from sandgate.proxy.cli import policy as policy_cli
from sandgate.proxy.cli import sandbox as sandbox_cli
from sandgate.proxy.cli import status as status_cli
from sandgate.proxy.config import GatewayConfig, load_config
from sandgate.proxy.errors import ConfigError, ListenerError
from sandgate.proxy.logsetup import configure_logging
from sandgate.proxy.version import version_line

__all__ = ["main"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sandgate", description="Egress gateway for AI-agent code sandboxes.")
    p.add_argument("--version", action="version", version=version_line(), help="print the version and exit")
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the gateway")
    run.add_argument("--config", type=Path, help="gateway config (YAML); default: embedded defaults")
    run.add_argument(
        "--port",
        type=_port,
        metavar="N",
        help="the explicit proxy listener's port (the config's one `mode: regular` listener); "
        "0: any free port",
    )
    run.add_argument(
        "--strict",
        action="store_true",
        help="refuse to start (and to reload) when any policy file is broken; default: a broken "
        "tenant file takes only its own tenant",
    )

    ca = sub.add_parser("ca", help="the gateway's certificate authority")
    ca_sub = ca.add_subparsers(dest="ca_command", required=True)
    for name, help_ in (
        ("init", "create the CA (key mode 0600)"),
        ("export", "print the CA certificate (PEM)"),
    ):
        c = ca_sub.add_parser(name, help=help_)
        c.add_argument("--config", type=Path)
        if name == "init":
            c.add_argument("--force", action="store_true", help="replace an existing CA")

    tok = sub.add_parser(
        "token", help="print a new sandbox proxy token (stdout) and its sha256: reference (stderr)"
    )
    tok.add_argument("--output", type=Path, help="write the token to this file (mode 0600) instead of stdout")

    status_cli.add_parser(sub)
    sandbox_cli.add_parsers(sub)
    credentials_cli.add_parsers(sub)
    audit_cli.add_parsers(sub)

    policy_cli.add_parser(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "run":
            return _run(args)
        if args.command == "ca":
            return _ca(args)
        if args.command == "token":
            return _token(args)
        if args.command == "status":
            return status_cli.run_status_command(args)
        if args.command == "sandbox":
            return sandbox_cli.run_sandbox_command(args)
        if args.command == "credentials":
            return credentials_cli.run_credentials_command(args)
        if args.command == "jail":
            return sandbox_cli.run_jail_command(args)
        if args.command == "audit":
            return audit_cli.run_audit_command(args)
        if args.command == "policy":
            return _policy(args)
    except (ConfigError, PolicyLoadError) as e:
        print(f"sandgate: {e}", file=sys.stderr)
        return EXIT_USAGE
    except SandgateError as e:
        print(f"sandgate: {e}", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_USAGE


def _run(args: argparse.Namespace) -> int:
    # Lazy: the runtime (mitmproxy master, addons) adds ~1.3 s that only `sandgate run` needs.
    from sandgate.proxy.runtime import serve

    config = load_config(args.config)
    if args.strict:
        config = config.model_copy(update={"strict_policy": True})
    if args.port is not None:
        config = with_proxy_port(config, args.port, args.config)
    configure_logging(config.log.level, config.log.format)
    try:
        return asyncio.run(serve(config))
    except PolicySetError as e:
        print(f"sandgate: the policy is invalid, not starting:\n{e}", file=sys.stderr)
        return EXIT_USAGE
    except ListenerError as e:
        print(f"sandgate: {e}", file=sys.stderr)
        return EXIT_FAILED


def _port(text: str) -> int:
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"expected a port number 0-65535, got {text!r}")
    return int(text)


def with_proxy_port(config: GatewayConfig, port: int, source: Path | None) -> GatewayConfig:
    """The config with its explicit proxy listener on `port`; ConfigError when that is not one
    listener (the transparent listeners keep their ports: the host's nftables redirect to them)."""
    explicit = [i for i, lst in enumerate(config.listeners) if lst.mode == "regular"]
    where = source or "the embedded defaults"
    if len(explicit) != 1:
        found = "none" if not explicit else f"{len(explicit)}"
        raise ConfigError(
            f"--port sets the port of the one explicit proxy listener (mode: regular); {where} "
            f"has {found}: set the ports under listeners: instead"
        )
    listeners = list(config.listeners)
    listeners[explicit[0]] = listeners[explicit[0]].model_copy(update={"port": port})
    return config.model_copy(update={"listeners": listeners})


def _ca(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    if args.ca_command == "init":
        cert = init_ca(config.ca_dir, force=args.force)
        print(cert)
    else:
        sys.stdout.write(export_ca(config.ca_dir))
    return EXIT_OK


def _token(args: argparse.Namespace) -> int:
    token = new_token()
    if args.output:
        fd = os.open(args.output, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
    else:
        print(token)
    print(f"sha256:{digest_token(token).hex()}", file=sys.stderr)
    return EXIT_OK


def _policy(args: argparse.Namespace) -> int:
    return policy_cli.run(args)


if __name__ == "__main__":
    raise SystemExit(main())
