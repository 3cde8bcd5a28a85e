"""The `sandgate` command: parse (parser.py), then import and run the one command asked for.

Each command's module is imported inside `_dispatch`, so a command loads only its own code:
`--version` and `status` do not pay for mitmproxy, regopy or opa_client, which only `run`,
`ca`, `jail` and `policy` use (tests/e2e/cli/test_startup_cost.py keeps it so).

Exit codes: 0 ok; 1 a policy test failure or a denied explain, a listener that cannot start
(or a state folder another gateway holds), a gateway that does not serve (`status`), none to
stop or one that does not stop (`stop`), none to reload or a fleet gateway that did not reload
(`policy reload`); 2 usage or invalid input (a broken policy or config), and no gateway
answering for `requests` and `policy status`. `jail` exits with its command's exit code. A
command's description says what else its 1 means (a refused push, a rule outside the ceiling,
an unknown request). A reader that closes the pipe early (`| head`) ends any command quietly,
with exit 0, as `audit` commands always did.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from sandgate.policy.errors import PolicyLoadError, SandgateError
from sandgate.proxy.cli.parser import build_parser
from sandgate.proxy.errors import ConfigError

__all__ = ["main"]

EXIT_USAGE = 2


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _dispatch(args)
    except (ConfigError, PolicyLoadError) as e:
        print(f"sandgate: {e}", file=sys.stderr)
        return EXIT_USAGE
    except SandgateError as e:
        print(f"sandgate: {e}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        if args.command == "run":
            # A gateway whose output went away is no clean exit: a supervisor must see it fail.
            raise
        # Not a fault: no traceback. Python flushes stdout again at exit and would complain
        # there, so stdout goes to /dev/null first. (SIG_DFL for SIGPIPE would be simpler, but
        # `run` must never die of a write to a guest that hung up.)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _dispatch(args: argparse.Namespace) -> int:
    """Run the command: each import below is lazy so that a command loads only its own code."""
    command = args.command
    if command == "run":
        # Lazy: the runtime (mitmproxy master, addons, engines) is ~1.3 s only `run` needs.
        from sandgate.proxy.cli.run import run_command

        return run_command(args)
    if command == "ca":
        # Lazy: the CA is made with mitmproxy's certs module.
        from sandgate.proxy.cli.ca import run_ca_command

        return run_ca_command(args)
    if command == "token":
        # Lazy: the token helpers live in the policy model package, which loads pydantic.
        from sandgate.proxy.cli.token import run_token_command

        return run_token_command(args)
    if command == "status":
        # Lazy: httpx and the config model, which `--version` does not need.
        from sandgate.proxy.cli.status import run_status_command

        return run_status_command(args)
    if command == "stop":
        # Lazy: the config model only (the state folder's lock names the gateway).
        from sandgate.proxy.cli.stop import run_stop_command

        return run_stop_command(args)
    if command == "sandbox":
        # Lazy: the registry's stores (redis) and the policy loader.
        from sandgate.proxy.cli.sandbox import run_sandbox_command

        return run_sandbox_command(args)
    if command == "jail":
        # Lazy: network namespaces and nftables, only for `jail`.
        from sandgate.proxy.cli.sandbox import run_jail_command

        return run_jail_command(args)
    if command == "credentials":
        # Lazy: the credential stores and brokers (httpx, cryptography).
        from sandgate.proxy.cli.credentials import run_credentials_command

        return run_credentials_command(args)
    if command == "audit":
        # Lazy: the audit readers (redis for the fleet stream).
        from sandgate.proxy.cli.audit import run_audit_command

        return run_audit_command(args)
    if command == "requests":
        # Lazy: httpx and the config model, as `status`.
        from sandgate.proxy.cli.requests import run_requests_command

        return run_requests_command(args)
    if command == "policy":
        # `policy reload|status` only ask the running gateway (or the fleet): not the Rego
        # engines and loaders below (~0.5 s CPU a call; tests run them often).
        from sandgate.proxy.cli import admin as admin_cli

        if args.policy_command in admin_cli.POLICY_COMMANDS:
            return admin_cli.run_policy_command(args)
        # Lazy: the Rego engines (regopy, opa_client) that check, test and explain run.
        from sandgate.proxy.cli.policy import run as run_policy_command

        return run_policy_command(args)
    if command == "usage":
        # Lazy: the audit readers, as `audit`.
        from sandgate.proxy.cli.usage import run_usage_command

        return run_usage_command(args)
    return EXIT_USAGE


if __name__ == "__main__":
    raise SystemExit(main())
