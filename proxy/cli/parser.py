"""The `sandgate` argument tree, apart from the commands' code: parsing an argument line (and
`--version`, `--help`) loads none of it, and `main` imports only the one command it runs.

Standard library and two enums only: tests/proxy/cli/test_startup_cost.py keeps it so.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from sandgate.policy.decision import Phase
from sandgate.policy.reasons import Reason
from sandgate.proxy.version import version_line

__all__ = ["build_parser"]

# The `type` statement is evaluated lazily: argparse's class is not subscriptable at run time.
type Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]


def build_parser() -> argparse.ArgumentParser:
    """The whole `sandgate` argument tree."""
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
        "--workers",
        type=_workers,
        metavar="N",
        help="gateway processes, one supervisor over them; default: the config's workers.count, "
        "else $SANDGATE_WORKERS, else one per core; 1: the gateway alone in this process",
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

    _add_status(sub)
    _add_stop(sub)
    _add_sandbox(sub)
    _add_credentials(sub)
    _add_audit(sub)
    _add_policy(sub)
    _add_requests(sub)
    return p


def _workers(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a worker count of at least 1, got {text!r}")
    return int(text)


def _port(text: str) -> int:
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"expected a port number 0-65535, got {text!r}")
    return int(text)


def _add_status(sub: Subparsers) -> None:
    """`status`."""
    p = sub.add_parser(
        "status",
        help="whether the local gateway serves (exit 0) or not (1); --wait until it does",
    )
    p.add_argument("--config", type=Path, help="the gateway's config (its admin socket and state_dir)")
    p.add_argument("--wait", action="store_true", help="wait until the gateway serves")
    p.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        metavar="S",
        help="with --wait: give up after S seconds (default 60)",
    )
    p.add_argument("--format", choices=("text", "json"), default="text")


def _add_stop(sub: Subparsers) -> None:
    """`stop`."""
    p = sub.add_parser(
        "stop",
        help="stop the local gateway (SIGTERM to it, or to its workers' supervisor) and wait until it exited",
    )
    p.add_argument("--config", type=Path, help="the gateway's config (its state_dir)")
    p.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="S",
        help="give up (exit 1) after S seconds; default shutdown.drain_seconds + "
        "workers.stop_margin_seconds + 10",
    )


def _add_requests(sub: Subparsers) -> None:
    """`requests list|show|approve|deny|grants|revoke`."""
    req = sub.add_parser("requests", help="requests held for a decision (ask rules): list, approve, deny")
    req_sub = req.add_subparsers(dest="requests_command", required=True)
    ls = req_sub.add_parser("list", help="the requests held now (and those whose client hung up)")
    show = req_sub.add_parser("show", help="one request, held or decided")
    show.add_argument("id")
    approve = req_sub.add_parser(
        "approve", help="release a held request; with --scope sandbox or tenant, grant what it asked for too"
    )
    approve.add_argument("id")
    approve.add_argument(
        "--scope",
        choices=("once", "sandbox", "tenant"),
        help=(
            "once: this request only (a held request's default); sandbox: a grant for its sandbox "
            "(a proposal's default); tenant: a grant in the tenant's grants file (redis in a fleet)"
        ),
    )
    approve.add_argument(
        "--ttl",
        metavar="D",
        help="how long the grant allows: 90s, 30m, 2h, 1d (default: approvals.grant_ttl_seconds for "
        "sandbox, none for tenant; capped by approvals.grant_max_ttl_seconds)",
    )
    deny = req_sub.add_parser("deny", help="refuse a held request (403 approval_denied)")
    deny.add_argument("id")
    grants = req_sub.add_parser("grants", help="the grants in force (approvals with scope sandbox or tenant)")
    revoke = req_sub.add_parser("revoke", help="withdraw a grant (by its approval id)")
    revoke.add_argument("id")
    for p in (ls, show, approve, deny, grants, revoke):
        p.add_argument("--config", type=Path, help="the gateway's config (its admin socket)")
        p.add_argument("--format", choices=("text", "json"), default="text")
    for p in (approve, deny):
        p.add_argument("--reason", metavar="TEXT", help="why (kept with the decision)")


def _add_sandbox(sub: Subparsers) -> None:
    """Add the `sandbox` and `jail` subcommands."""
    sb = sub.add_parser("sandbox", help="register sandboxes and their host rules (needs root)")
    sb_sub = sb.add_subparsers(dest="sandbox_command", required=True)
    add = sb_sub.add_parser(
        "add", help="register a sandbox (on a host interface, by proxy token, or both) and install its rules"
    )
    add.add_argument("--interface", help="the host-side interface (TAP or veth) of the sandbox")
    add.add_argument(
        "--address",
        action="append",
        default=[],
        help="a source address of the sandbox, IPv4 or IPv6 (repeat for several; needed with --interface)",
    )
    add.add_argument(
        "--token",
        metavar="REF",
        help="its explicit-proxy token: env:VAR, file:PATH or sha256:HEX (only the digest is stored)",
    )
    add.add_argument("--tenant", required=True)
    add.add_argument("--id", help="sandbox id (default: the interface name)")
    add.add_argument(
        "--replace",
        action="store_true",
        help="replace a sandbox registered under this id with these settings (in place, no identity gap)",
    )
    add.add_argument("--config", type=Path)
    up = sb_sub.add_parser(
        "update", help="change a registered sandbox in place (tenant, address, interface or token)"
    )
    up.add_argument("id")
    up.add_argument("--tenant")
    up.add_argument("--interface")
    up.add_argument(
        "--address",
        action="append",
        default=[],
        help="the sandbox's source addresses from now on (repeat for several; replaces all of them)",
    )
    up.add_argument(
        "--token", metavar="REF", help="a new explicit-proxy token: env:VAR, file:PATH or sha256:HEX"
    )
    up.add_argument("--config", type=Path)
    rm = sb_sub.add_parser("remove", help="unregister a sandbox and remove its rules")
    rm.add_argument("id")
    rm.add_argument("--config", type=Path)
    ls = sb_sub.add_parser(
        "list", help="every sandbox the gateway knows (tenant files and registry), how it is identified"
    )
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


def _add_credentials(sub: Subparsers) -> None:
    """`credentials` and its subcommands."""
    creds = sub.add_parser(
        "credentials", help="credential placeholders; values in the running gateway's store"
    )
    creds_sub = creds.add_subparsers(dest="credentials_command", required=True)
    ph = creds_sub.add_parser("placeholders", help="a sandbox's placeholders, as environment assignments")
    ph.add_argument("--sandbox", required=True)
    ph.add_argument("--config", type=Path)
    ph.add_argument("--format", choices=("env", "json"), default="env")

    for name, help_ in (
        ("set", "store a credential value (stdin or --from-env), adding or replacing it"),
        ("rotate", "replace a stored credential value (it must exist)"),
    ):
        c = creds_sub.add_parser(name, help=help_)
        c.add_argument("--tenant", required=True)
        c.add_argument("name", help="the credential name (tenant files reference it as stored:NAME)")
        c.add_argument("--from-env", metavar="VAR", help="read the value from this environment variable")
        c.add_argument("--config", type=Path)
    rm = creds_sub.add_parser("remove", help="delete a stored credential value")
    rm.add_argument("--tenant", required=True)
    rm.add_argument("name")
    rm.add_argument("--config", type=Path)
    ls = creds_sub.add_parser(
        "list", help="stored credentials (tenant, name, version, updated; never values)"
    )
    ls.add_argument("--tenant")
    ls.add_argument("--format", choices=("table", "json"), default="table")
    ls.add_argument("--config", type=Path)
    rk = creds_sub.add_parser("rekey", help="re-seal every stored value with the newest store key")
    rk.add_argument("--config", type=Path)
    ak = creds_sub.add_parser("add-key", help="add a new newest store key (file store keys only)")
    ak.add_argument("--config", type=Path)


# --- audit ---------------------------------------------------------------------------------


def _add_audit(sub: Subparsers) -> None:
    """Add the `audit` subcommand and its `tail`, `query`, `stats` and `suggest`."""
    audit = sub.add_parser("audit", help="read the audit trail: tail, query, stats, suggest")
    audit_sub = audit.add_subparsers(dest="audit_command", required=True)

    tail = audit_sub.add_parser("tail", help="the last records, optionally following new ones")
    tail.add_argument("-n", "--lines", type=_count(0), default=10, metavar="N", help="how many (default 10)")
    tail.add_argument("-f", "--follow", action="store_true", help="keep printing records as they are written")
    query = audit_sub.add_parser("query", help="records matching filters, oldest first")
    query.add_argument("--limit", type=_count(1), metavar="N", help="stop after N records")
    stats = audit_sub.add_parser("stats", help="per tenant: counts by decision and reason, top denials")
    stats.add_argument("--top", type=_count(1), default=10, metavar="N", help="entries in top lists (10)")
    suggest = audit_sub.add_parser(
        "suggest", help="allow rules (YAML, to review) that would permit a sandbox's repeated denials"
    )
    suggest.add_argument("--min-count", type=_count(1), default=2, metavar="N", help="denials per rule (2)")
    for p in (tail, query, stats, suggest):
        _add_source(p)
        # stats and suggest count decisions; suggest is about one sandbox.
        _add_filters(p, any_event=p in (tail, query), one_sandbox=p is suggest)
        if p is not suggest:
            _add_format(p, "table")


def _count(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer of at least `minimum`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}")
        return value

    return parse


def _add_source(p: argparse.ArgumentParser) -> None:
    """`--config F [--stream]`, `--file PATH` or `--redis URL [--prefix P]`: where the audit trail is."""
    where = p.add_mutually_exclusive_group()
    where.add_argument("--config", type=Path, help="gateway config: read its audit.path (default: defaults)")
    where.add_argument("--file", type=Path, help="an audit.jsonl file (its rotated .1 … .N are read too)")
    where.add_argument("--redis", metavar="URL", help="read the fleet audit stream in this redis")
    p.add_argument(
        "--stream", action="store_true", help="with --config: read the fleet stream of its redis: section"
    )
    p.add_argument("--prefix", help="with --redis: the fleet's key prefix (default sandgate:)")


def _add_filters(p: argparse.ArgumentParser, *, any_event: bool, one_sandbox: bool) -> None:
    """The record filters shared by every audit subcommand (repeat one to accept any of its values)."""
    f = p.add_argument_group("filters (AND across filters, OR within a repeated one)")
    f.add_argument("--tenant", action="append", default=[])
    f.add_argument("--sandbox", action="append", default=[], required=one_sandbox)
    f.add_argument("--host", action="append", default=[], help="exact host, or *.suffix for its subdomains")
    f.add_argument(
        "--reason", action="append", default=[], choices=[r.value for r in Reason], metavar="REASON"
    )
    f.add_argument("--decision", action="append", default=[], choices=("allow", "deny", "would_deny", "ask"))
    f.add_argument("--phase", action="append", default=[], choices=[p.value for p in Phase])
    f.add_argument(
        "--credential", action="append", default=[], metavar="NAME", help="records that injected it"
    )
    f.add_argument(
        "--approval",
        action="append",
        default=[],
        metavar="ID",
        help="the chain of one access request, every kind of record: asked, grant made, released, "
        "grant used, grant expired or revoked",
    )
    if any_event:
        f.add_argument("--event", choices=("decision", "policy_reload", "grant"), default="decision")
    f.add_argument("--since", metavar="T", help="from this time: RFC 3339, or 15m, 2h, 1d ago")
    f.add_argument("--until", metavar="T", help="before this time: RFC 3339, or 15m, 2h, 1d ago")


def _add_format(p: argparse.ArgumentParser, default: str) -> None:
    """`--format json|table`."""
    p.add_argument("--format", choices=("json", "table"), default=default)


# --- policy --------------------------------------------------------------------------------


def _add_policy(sub: Subparsers) -> None:
    """Add `policy` and its subcommands to the top-level subparsers."""
    pol = sub.add_parser("policy", help="policy files: check, test, explain, schema, push")
    pol_sub = pol.add_subparsers(dest="policy_command", required=True)

    check = pol_sub.add_parser(
        "check",
        help="validate rules directories, tenant/preset/base files, .rego modules and test case files",
    )
    check.add_argument(
        "paths", type=Path, nargs="*", metavar="PATH", help="default: --config's rules_dir, else rules"
    )
    check.add_argument(
        "--rules",
        type=Path,
        metavar="DIR",
        help="the rules directory a tenant, preset or base file will join, checked with it in place "
        "(default: --config's rules_dir, else the one the file is in, else rules)",
    )
    _guard_config(check)
    _format(check)

    test = pol_sub.add_parser("test", help="run Rego test_ rules and YAML test cases")
    test.add_argument("paths", type=Path, nargs="*", metavar="PATH", help="default: rules")
    test.add_argument("-v", "--verbose", action="store_true", help="list every test, not only failures")
    _guard_config(test)
    _format(test)

    exp = pol_sub.add_parser("explain", help="the decision for one request, step by step")
    exp.add_argument("method", metavar="METHOD", help="GET, POST, ... or CONNECT")
    exp.add_argument("url", metavar="URL", help="https://host/path?query, or host:port for CONNECT")
    exp.add_argument("--tenant", help="the tenant (default: the sandbox's)")
    exp.add_argument("--sandbox", help="a registered sandbox (default: a sandbox named 'explain')")
    exp.add_argument("--rules", type=Path, default=Path("rules"), help="rules directory (default: rules)")
    exp.add_argument("-H", "--header", action="append", default=[], metavar="'NAME: VALUE'")
    exp.add_argument("--body-size", type=int, help="declared request body length")
    exp.add_argument("--client", help="the guest's address")
    exp.add_argument(
        "--resolve", action="append", default=[], metavar="HOST=IP", help="resolve HOST to IP (repeatable)"
    )
    _guard_config(exp)
    _format(exp)

    schema = pol_sub.add_parser("schema", help="JSON Schema of tenant files (or of the Rego input)")
    schema.add_argument("--input", action="store_true", help="the Rego input document instead")
    _format(schema)

    push = pol_sub.add_parser("push", help="upload Rego modules and tenant data to an OPA server")
    push.add_argument("rules_dir", type=Path, nargs="?", default=Path("rules"))
    push.add_argument("--url", required=True, help="the OPA server, e.g. http://127.0.0.1:8181")
    push.add_argument("--token-env", help="environment variable holding the server's bearer token")
    push.add_argument("--timeout", type=float, default=10.0, help="seconds per call (default 10)")
    push.add_argument("--keep", action="store_true", help="keep sandgate/ policies this push does not have")
    _format(push)

    prove = pol_sub.add_parser("prove", help="any request the tenants' rules allow outside the ceiling")
    prove.add_argument("paths", type=Path, nargs="*", metavar="PATH", help="default: rules")
    prove.add_argument("--ceiling", type=Path, metavar="FILE", help="default: PATH/ceiling.yaml")
    prove.add_argument("--config", type=Path, metavar="FILE", help="no PATH: this gateway config's rules")
    _format(prove)
    prove.add_argument("--json", dest="format", action="store_const", const="json", help="--format json")

    _add_policy_admin(pol_sub)


def _guard_config(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="the gateway config whose address_guard applies (default: a guard that opens no range)",
    )


def _format(p: argparse.ArgumentParser) -> None:
    p.add_argument("--format", choices=("text", "json"), default="text")


def _add_policy_admin(pol_sub: Subparsers) -> None:
    """`policy reload` and `policy status` (the running gateway's)."""
    reload = pol_sub.add_parser("reload", help="reload the running gateway's policy now")
    reload.add_argument("--config", type=Path)
    _format(reload)
    status = pol_sub.add_parser("status", help="the running gateway's policy version, listeners, reloads")
    status.add_argument("--config", type=Path)
    _format(status)
