"""`sandgate ca init|export`: the gateway's certificate authority."""

from __future__ import annotations

import argparse
import sys

from sandgate.proxy.config import load_config
from sandgate.proxy.startup.ca import export_ca, init_ca

__all__ = ["run_ca_command"]

EXIT_OK = 0


def run_ca_command(args: argparse.Namespace) -> int:
    """Create the CA (printing its certificate's path) or print its certificate."""
    config = load_config(args.config)
    if args.ca_command == "init":
        cert = init_ca(config.ca_dir, force=args.force)
        print(cert)
    else:
        sys.stdout.write(export_ca(config.ca_dir))
    return EXIT_OK
