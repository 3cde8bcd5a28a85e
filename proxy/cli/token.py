"""`sandgate token`: a new sandbox proxy token and the sha256: reference tenant files hold."""

from __future__ import annotations

import argparse
import os
import sys

from sandgate.policy.model.sandbox_tokens import digest_token, new_token

__all__ = ["run_token_command"]

EXIT_OK = 0
EXIT_USAGE = 2


def run_token_command(args: argparse.Namespace) -> int:
    """Print the token (or write it, mode 0600, to --output) and its reference on stderr."""
    token = new_token()
    if args.output:
        try:
            # Never over a token in use: replacing it would lock its sandbox out.
            fd = os.open(args.output, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError as e:
            why = "exists; remove it first to replace it" if isinstance(e, FileExistsError) else e.strerror
            print(f"sandgate: {args.output}: {why}", file=sys.stderr)
            return EXIT_USAGE
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
    else:
        print(token)
    print(f"sha256:{digest_token(token).hex()}", file=sys.stderr)
    return EXIT_OK
