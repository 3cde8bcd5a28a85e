"""The `sandgate` argument tree, apart from the commands' code: parsing an argument line (and
`--version`, `--help`) loads none of it, and `main` imports only the one command it runs.

Standard library and two enums only: tests/e2e/cli/test_startup_cost.py keeps it so.
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
    p.add_argument(
        "--version",
        action="version",
        version=version_line(),
        help="print the versions of sandgate, mitmproxy and Python, and exit",
    )
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser(
        "run",
        help="run the gateway",
        description="Once the gateway serves, it logs `gateway.ready` (version, listeners as "
        "mode@host:port, policy version, tenant and sandbox counts and ids, CA certificate, audit "
        "file, admin addresses) and, with a console log or when stderr is a terminal, prints them "
        "there as a block, with how each sandbox reaches it (the block Getting started shows). A "
        "listener that cannot be bound (proxy, transparent, DNS, the admin socket or admin.listen) "
        "is one line naming it, its address and why, and exit 1; so is a state folder another "
        "gateway holds (`state_dir ... is in use by the gateway with pid N`). An invalid config, or "
        "a policy it cannot start with, is exit 2.",
    )
    run.add_argument("--config", type=Path, help="gateway config (YAML); default: embedded defaults")
    run.add_argument(
        "--port",
        type=_port,
        metavar="N",
        help="the explicit proxy listener's port (the config's one `mode: regular` listener); "
        "0: any free port; refused (exit 2) when the config has none or several",
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
        help="refuse to start when any policy file is broken, and refuse such a reload whole (the "
        "policy in force stays); default: a broken tenant file takes only its own tenant",
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
    _add_usage(sub)
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
        description="The gateway serves when its admin API answers /readyz with 200: the policy "
        "loaded, every listener bound, redis answering (with redis:) and every worker ready; with "
        "admin.enabled: false, its status file answers instead. When it does not serve, one line on "
        "stderr says why (`is starting` while a gateway holds the state folder's lock but does not "
        "answer yet). It names the gateway's pid, the one `sandgate stop` signals: with workers the "
        "supervisor's, as `(pid N, the supervisor of 2 workers)`, and a `workers:` line gives each "
        "worker's index and pid. In JSON, status.pid is that pid and status.workers the workers "
        "(with the admin API off, status.worker_pids).",
    )
    p.add_argument(
        "--config",
        type=Path,
        help="the gateway's config (its admin socket and state_dir; without it, the gateway of "
        "$SANDGATE_HOME, else ~/.sandgate)",
    )
    p.add_argument("--wait", action="store_true", help="poll until the gateway serves, or --timeout passes")
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
        description="The gateway is the process that holds its state folder's lock (the supervisor "
        "with workers, else the gateway itself); it drains before it exits. Exit 0 once it is gone "
        "(`stopped: gateway (pid N)`); 1 when no gateway runs on the state folder, it cannot be "
        "signalled (it runs as another user) or it still runs after --timeout.",
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
    req = sub.add_parser(
        "requests",
        help="requests held for a decision (ask rules): list, approve, deny",
        description="Requests held by ask rules (or proposed from inside a sandbox), and the grants "
        "approvals made, through the running gateway's admin API. approve, deny and revoke record "
        "the operating-system user who runs them as `by`. Exit 1: no such request or grant, or it "
        "was already decided; 2: no gateway answers, or usage (a scope the request cannot take, a "
        "bad --ttl, --until or --uses). See Approvals in the manual.",
    )
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
    approve.add_argument(
        "--until",
        metavar="TIME",
        help="when the grant ends, an RFC 3339 time with its zone (2026-12-01T22:40:00Z); instead "
        "of --ttl, capped the same way",
    )
    approve.add_argument(
        "--uses",
        metavar="N",
        type=int,
        help="the grant allows at most N requests in all, counted across the gateway's workers (and "
        "the fleet's gateways with redis); then it is exhausted and requests are asked about again",
    )
    approve.add_argument(
        "--any-arguments",
        action="store_true",
        help="a held MCP tool call: its grant (--scope sandbox or tenant) allows that tool with any "
        "arguments; without it, the grant allows the tool with exactly these arguments (their "
        "arguments_sha256) only. The grant is bound to the host, port, method and path too",
    )
    deny = req_sub.add_parser(
        "deny", help="refuse a held request (403 approval_denied; a tool call: a JSON-RPC error)"
    )
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
    sb = sub.add_parser(
        "sandbox",
        help="register sandboxes and their host rules (an interface needs root)",
        description="A sandbox is registered on a host interface, with nftables rules for it (root), "
        "or by proxy token, or both; update and add --replace change one in place. add, update and "
        "remove go through the running gateway's admin API when one answers; else they write the "
        "registry (<state_dir>/sandboxes.json, or redis with redis:), which the gateway reads at its "
        "next reload. Exit 2 for an id that is not registered (a tenant file's sandbox changes in "
        "its file).",
    )
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
        "list",
        help="every sandbox the gateway knows (tenant files and registry), how it is identified",
        description="One row per sandbox: its tenant, how it is identified (its token's reference, "
        "never the token; its interface and addresses) and where it is defined (file:line, "
        "`registry <path>`, `redis`); `no sandboxes` when there are none. From the running gateway "
        "(/v1/status); without one, from the rules directory and the registry as a gateway started "
        "now would load them, with a note on stderr that says so and names the tenant files that do "
        "not load.",
    )
    ls.add_argument("--config", type=Path)
    ls.add_argument("--format", choices=("text", "json"), default="text")

    jail = sub.add_parser(
        "jail",
        help="run a command in a fresh network namespace behind the gateway (needs root)",
        description="The namespace is a sandbox of the tenant for as long as the command runs, "
        "through the gateway of the config's state folder (a private one is started when none "
        "runs); everything is undone when the command ends. Exits with the command's exit code "
        "(128+N when signal N ended it).",
    )
    jail.add_argument("--tenant", help="the sandbox's tenant (default: the only tenant, when there is one)")
    jail.add_argument("--sandbox", help="sandbox id (default: jail-<random>)")
    jail.add_argument("--config", type=Path)
    jail.add_argument(
        "argv", nargs=argparse.REMAINDER, metavar="-- COMMAND", help="the command to run, after --"
    )


def _add_credentials(sub: Subparsers) -> None:
    """`credentials` and its subcommands."""
    creds = sub.add_parser(
        "credentials",
        help="credential placeholders; values in the running gateway's store",
        description="Stored values are sealed at rest. set, rotate, remove and list go through the "
        "running gateway's admin API when one answers, else straight to the store (redis with "
        "redis:, else <state_dir>/credentials.sealed.json); rekey always works on the store itself. "
        "A value is read from --from-env VAR, a prompt that does not echo on a terminal, or stdin; "
        "never from the command line, and it is never printed back.",
    )
    creds_sub = creds.add_subparsers(dest="credentials_command", required=True)
    ph = creds_sub.add_parser(
        "placeholders",
        help="a sandbox's placeholders, as environment assignments",
        description="One VAR=value line per credential of the sandbox's tenant (VAR: the "
        "credential's env, else SANDGATE_<NAME>), for the sandbox's environment; from the config's "
        "rules directory and registry file.",
    )
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
    rm = creds_sub.add_parser(
        "remove", help="delete a stored credential value", description="Exit 1 when it is not set."
    )
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
    audit = sub.add_parser("audit", help="read the audit trail: tail, query, stats, suggest, verify")
    audit_sub = audit.add_subparsers(dest="audit_command", required=True)

    tail = audit_sub.add_parser("tail", help="the last records, optionally following new ones")
    tail.add_argument("-n", "--lines", type=_count(0), default=10, metavar="N", help="how many (default 10)")
    tail.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="keep printing records as they are written, across rotations; SIGINT or SIGTERM ends it "
        "with exit 0, also as a background job",
    )
    query = audit_sub.add_parser(
        "query",
        help="records matching filters, oldest first",
        description="Files are read line by line, in bounded memory whatever their size (a 1 GB trail too).",
    )
    query.add_argument("--limit", type=_count(1), metavar="N", help="stop after N records")
    stats = audit_sub.add_parser(
        "stats",
        help="per tenant: counts by decision and reason, top denials; or per MCP tool or method (--by)",
        description="The top lists are of denied hosts and denial reasons (deny and would_deny). "
        "Then per sandbox, its approvals: asks by outcome, the time held (p50, p99, max), grants made.",
    )
    stats.add_argument("--top", type=_count(1), default=10, metavar="N", help="entries in top lists (10)")
    stats.add_argument(
        "--by",
        choices=("tenant", "tool", "rpc-method"),
        default="tenant",
        help="tenant (default); tool: MCP tool calls per tool, rpc-method: MCP and JSON-RPC messages "
        "per method, each with its verdicts, denial reasons and top hosts (most called first, --top of them)",
    )
    suggest = audit_sub.add_parser(
        "suggest",
        help="allow rules (YAML, to review) that would permit a sandbox's repeated denials",
        description="Printed, never applied: nothing writes a policy file. Only denials a missing "
        "allow rule explains are used (host_not_allowed, port_not_allowed, method_not_allowed, "
        "path_not_allowed); for private_address denials it prints, as comments, the change to the "
        "operator's gateway config (address_guard) plus the tenant's cidr rule. MCP and JSON-RPC "
        "calls refused inside a rule that allows their host (tool_not_allowed, tool_denied, "
        "argument_not_allowed, rpc_method_not_allowed) get the lines to add to that rule's mcp: or "
        "jsonrpc: section, as comments; argument denials need a predicate written by hand.",
    )
    suggest.add_argument("--min-count", type=_count(1), default=2, metavar="N", help="denials per rule (2)")
    _add_audit_verify(audit_sub)
    for p in (tail, query, stats, suggest):
        _add_source(p)
        # stats and suggest count decisions; suggest is about one sandbox.
        _add_filters(p, any_event=p in (tail, query), one_sandbox=p is suggest)
        if p is not suggest:
            _add_format(p, "table", ocsf=p is not stats)


def _add_audit_verify(audit_sub: Subparsers) -> None:
    """`audit verify [FILES...]`."""
    verify = audit_sub.add_parser(
        "verify",
        help="check the trail's hash chain and signed checkpoints: exit 0 intact, 1 tampered, 2 bad input",
        description="Walks the trail oldest first and reports the first broken link (file, line, what "
        "broke: an altered, deleted, inserted or reordered line, a cut, a bad signature) and the last "
        "checkpoint whose signature held. See Tamper evidence in the audit manual.",
    )
    verify.add_argument(
        "files",
        nargs="*",
        type=Path,
        metavar="FILE",
        help="trail files, oldest first (default: the config's audit file and its rotated copies)",
    )
    verify.add_argument("--config", type=Path, help="gateway config: its audit.path and state_dir")
    verify.add_argument(
        "--key", type=Path, help="the public key (PEM; default: <state_dir>/ca/audit-signing.pub.pem)"
    )
    verify.add_argument(
        "--partial",
        action="store_true",
        help="accept a trail whose first lines are gone (rotation removed its oldest file); by default "
        "only when every rotated file the config keeps exists",
    )
    verify.add_argument(
        "--expect-seq",
        type=_count(1),
        metavar="N",
        help="the trail must reach checkpoint N (one a SIEM or an earlier verify saw): a trail cut "
        "before it is reported truncated",
    )
    verify.add_argument("--format", choices=("text", "json"), default="text")


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
    f.add_argument(
        "--tool",
        action="append",
        default=[],
        metavar="GLOB",
        help="records of an MCP exchange with a tools/call of a matching tool (* and ?, any case)",
    )
    f.add_argument(
        "--rpc-method",
        action="append",
        default=[],
        metavar="GLOB",
        help="records of an MCP or JSON-RPC exchange with a message of a matching method (tools/*)",
    )
    if any_event:
        f.add_argument(
            "--event",
            choices=("decision", "policy_reload", "grant", "sandbox_update", "finding", "any"),
            default="decision",
            help="records of this event (any: every kind, with --format json or ocsf)",
        )
    f.add_argument("--since", metavar="T", help="from this time: RFC 3339, or 15m, 2h, 1d ago")
    f.add_argument("--until", metavar="T", help="before this time: RFC 3339, or 15m, 2h, 1d ago")


def _add_format(p: argparse.ArgumentParser, default: str, *, ocsf: bool = False) -> None:
    """`--format json|table` (and `ocsf`: the records' OCSF 1.8.0 events as JSON lines)."""
    p.add_argument(
        "--format", choices=("json", "table", "ocsf") if ocsf else ("json", "table"), default=default
    )


# --- policy --------------------------------------------------------------------------------


def _add_policy(sub: Subparsers) -> None:
    """Add `policy` and its subcommands to the top-level subparsers."""
    pol = sub.add_parser("policy", help="policy files: check, test, explain, schema, push")
    pol_sub = pol.add_subparsers(dest="policy_command", required=True)

    check = pol_sub.add_parser(
        "check",
        help="validate rules directories, tenant/preset/grants/base files, .rego modules and test case files",
        description="A tenant, preset, grants or base file is checked in the rules directory it will "
        "join (see --rules), as if it were there already. A folder that defines no tenant is an "
        "error. Cidrs the address guard never opens get a warning, which does not fail the check.",
    )
    check.add_argument(
        "paths",
        type=Path,
        nargs="*",
        metavar="PATH",
        help="default: the --rules directory, else --config's rules_dir, else rules",
    )
    check.add_argument(
        "--rules",
        type=Path,
        metavar="DIR",
        help="the rules directory a tenant, preset, grants or base file will join, checked with it in "
        "place (default: --config's rules_dir, else the one the file is in, else rules)",
    )
    _guard_config(
        check,
        "the gateway config whose address_guard the warnings check cidrs against (default: its "
        "ranges unknown, and the warnings say so)",
    )
    _format(check)

    test = pol_sub.add_parser("test", help="run Rego test_ rules and YAML test cases")
    test.add_argument("paths", type=Path, nargs="*", metavar="PATH", help="default: rules")
    test.add_argument("-v", "--verbose", action="store_true", help="list every test, not only failures")
    _guard_config(
        test,
        "the gateway config whose address_guard applies, and whose resolver.hosts answer for names a "
        "case file does not list (default: a guard that opens no range)",
    )
    _format(test)

    exp = pol_sub.add_parser(
        "explain",
        help="the decision for one request, step by step",
        description="The decision, then each step of the evaluation order (with Rego, its modules "
        "and the input document).",
    )
    exp.add_argument("method", metavar="METHOD", help="GET, POST, ... or CONNECT; DNS: a guest's DNS query")
    exp.add_argument("url", metavar="URL", help="https://host/path?query, host:port (CONNECT), a name (DNS)")
    exp.add_argument("--tenant", help="the tenant (default: the sandbox's)")
    exp.add_argument("--sandbox", help="a registered sandbox (default: a sandbox named 'explain')")
    exp.add_argument("--rules", type=Path, default=Path("rules"), help="rules directory (default: rules)")
    exp.add_argument("-H", "--header", action="append", default=[], metavar="'NAME: VALUE'")
    exp.add_argument("--body-size", type=int, help="declared request body length")
    exp.add_argument("--client", help="the guest's address")
    exp.add_argument(
        "--resolve", action="append", default=[], metavar="HOST=IP", help="resolve HOST to IP (repeatable)"
    )
    _guard_config(
        exp,
        "the gateway config whose address_guard and whole resolver: section apply, after --resolve "
        "(default: a guard that opens no range, the system's resolver)",
    )
    _format(exp)

    schema = pol_sub.add_parser("schema", help="JSON Schema of tenant files (or of the Rego input)")
    schema.add_argument("--input", action="store_true", help="the Rego input document instead")
    _format(schema)

    push = pol_sub.add_parser(
        "push",
        help="upload Rego modules and tenant data to an OPA server",
        description="Exit 1 when the OPA server refuses the push.",
    )
    push.add_argument("rules_dir", type=Path, nargs="?", default=Path("rules"))
    push.add_argument("--url", required=True, help="the OPA server, e.g. http://127.0.0.1:8181")
    push.add_argument("--token-env", help="environment variable holding the server's bearer token")
    push.add_argument("--timeout", type=float, default=10.0, help="seconds per call (default 10)")
    push.add_argument("--keep", action="store_true", help="keep sandgate/ policies this push does not have")
    _format(push)

    prove = pol_sub.add_parser(
        "prove",
        help="any request the tenants' rules allow outside the ceiling",
        description="Each rule that allows requests outside the operator's ceiling, with a "
        "counter-example. Exit 0: every rule stays inside; 1: something is outside (or could not be "
        "decided); 2: a ceiling or policy that does not load. See Proving a ceiling in the manual's "
        "Approvals page.",
    )
    prove.add_argument("paths", type=Path, nargs="*", metavar="PATH", help="default: rules")
    prove.add_argument("--ceiling", type=Path, metavar="FILE", help="default: PATH/ceiling.yaml")
    prove.add_argument("--config", type=Path, metavar="FILE", help="no PATH: this gateway config's rules")
    _format(prove)
    prove.add_argument("--json", dest="format", action="store_const", const="json", help="--format json")

    _add_policy_admin(pol_sub)


def _guard_config(p: argparse.ArgumentParser, help_: str) -> None:
    """`--config FILE`: the gateway config, with what of it this command uses."""
    p.add_argument("--config", type=Path, metavar="FILE", help=help_)


def _format(p: argparse.ArgumentParser) -> None:
    p.add_argument("--format", choices=("text", "json"), default="text")


def _add_policy_admin(pol_sub: Subparsers) -> None:
    """`policy reload` and `policy status` (the running gateway's)."""
    reload = pol_sub.add_parser(
        "reload",
        help="reload the running gateway's policy now",
        description="Goes through the gateway's admin API and waits for its answer: the version now in "
        "force and the one before, or the refusal with file:line errors (exit 2; the policy in force "
        "stays). A reload that leaves a broken tenant file out is exit 2 too. With redis: every "
        "gateway of the fleet reloads and each one's answer is shown (exit 1 when one refused, left a "
        "file out or did not answer within 10 s); without a local gateway, a fleet host publishes the "
        "reload itself. Exit 1 when no gateway runs. With the admin API off, it sends SIGHUP and "
        "cannot confirm the outcome.",
    )
    status = pol_sub.add_parser(
        "status",
        help="the running gateway's policy version, listeners, reloads",
        description="The running gateway's status: its pid, policy version, tenants, sandboxes (the "
        "first 20), listeners, broken files and notes, reload failures, audit queue depth, last "
        "reload. With redis: the fleet instead: each gateway's policy and fleet version, and whether "
        "it is in sync. With the admin API off, the pid and policy version from its status file. "
        "Exit 2 when no gateway runs.",
    )
    for p in (reload, status):
        p.add_argument("--config", type=Path, help="the gateway's config (its admin socket, redis:)")
        _format(p)


def _add_usage(sub: Subparsers) -> None:
    """`usage`: per hour and per sandbox (or tenant), from the audit trail."""
    p = sub.add_parser(
        "usage",
        help="usage per hour and sandbox (or tenant) from the audit trail: requests, bytes, upstream "
        "time, approvals, credentials",
        description="Per UTC hour (2026-12-03T04:00Z) and per sandbox (or tenant): requests (phase "
        "request) and connections (connect, tls, dns) apart, allowed (allow, would_deny) and denied, "
        "bytes up and down, upstream_ms (allowed requests' duration_ms less their approval hold), "
        "approvals asked and the seconds they waited, requests per credential injected. Reads the "
        "trail (rotated files too) line by line, in memory that grows with hours x sandboxes only.",
    )
    _add_source(p)
    p.add_argument("--since", metavar="T", help="from this time: RFC 3339, or 15m, 2h, 1d ago")
    p.add_argument("--until", metavar="T", help="before this time: RFC 3339, or 15m, 2h, 1d ago")
    p.add_argument(
        "--by", choices=("sandbox", "tenant"), default="sandbox", help="a row per sandbox (default) or tenant"
    )
    p.add_argument(
        "--format",
        choices=("table", "csv", "json"),
        default="table",
        help="csv: a header row, credentials as name=count;...; json: an array of rows",
    )
