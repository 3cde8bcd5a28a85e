"""`sandgate run`: the gateway, from a config file and the command line's overrides."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from sandgate.policy.errors import PolicySetError
from sandgate.proxy.config import GatewayConfig, load_config
from sandgate.proxy.errors import ConfigError, ListenerError
from sandgate.proxy.logsetup import configure_logging
from sandgate.proxy.runtime import serve

__all__ = ["run_command", "with_proxy_port"]

EXIT_FAILED, EXIT_USAGE = 1, 2


def run_command(args: argparse.Namespace) -> int:
    """Serve until stopped; 2 for an invalid policy, 1 for a listener that cannot start."""
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
