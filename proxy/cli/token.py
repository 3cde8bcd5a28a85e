"""`sandgate token`: a new sandbox proxy token and the sha256: reference tenant files hold."""

from __future__ import annotations

import argparse
import os
import sys

from sandgate.policy.model.sandbox_tokens import digest_token, new_token

__all__ = ["run_token_command"]

EXIT_OK = 0


def run_token_command(args: argparse.Namespace) -> int:
    """Print the token (or write it, mode 0600, to --output) and its reference on stderr."""
    token = new_token()
    if args.output:
        fd = os.open(args.output, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
    else:
        print(token)
    print(f"sha256:{digest_token(token).hex()}", file=sys.stderr)
    return EXIT_OK
