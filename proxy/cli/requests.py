"""`sandgate requests list|show ID|approve ID [--scope S] [--ttl D | --until TIME] [--uses N]
[--any-arguments]|deny ID [--reason TEXT]|grants|revoke ID`: requests held for a decision
(`ask` rules, `mcp.tools.ask` tool calls) or proposed by a sandbox, through the running
gateway's admin API.

Scope `once` (a held request's default) releases that one request and changes no rule;
`sandbox` (a proposal's default) also grants what it asked for to its sandbox for a TTL;
`tenant` grants it to the whole tenant (its grants file, or redis in a fleet). A held tool
call's grant names its tool and its exact arguments (their digest); `--any-arguments`: the
tool with any arguments. A grant ends after --ttl or at --until (an RFC 3339 time), and with
--uses N it allows N requests in all; `grants` shows the uses taken and left.

Exit 0: done. 1: no such request or grant, or it was already decided. 2: no gateway answers,
or usage (a scope the request cannot take, a bad --ttl, --until or --uses).
"""

from __future__ import annotations

import argparse
import getpass
import json
import re
import sys
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sandgate.proxy.admin import client as admin_client
from sandgate.proxy.audit.format import clean
from sandgate.proxy.config import load_config

__all__ = ["run_requests_command"]

EXIT_OK, EXIT_REFUSED, EXIT_USAGE = 0, 1, 2

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd]?)$")
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86_400}


def parse_duration(text: str) -> float:
    """`90`, `90s`, `30m`, `2h`, `1d` in seconds (ValueError otherwise)."""
    found = _DURATION.match(text.strip())
    if found is None or float(found.group(1)) <= 0:
        raise ValueError(f"--ttl {text!r}: use a positive duration like 90s, 30m, 2h or 1d")
    return float(found.group(1)) * _UNIT_SECONDS[found.group(2)]


def parse_until(text: str) -> str:
    """An RFC 3339 time with its zone, as the admin API takes it (ValueError otherwise)."""
    try:
        when = datetime.fromisoformat(text.strip().replace("z", "Z").replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"--until {text!r}: use an RFC 3339 time like 2026-12-01T22:40:00Z") from None
    if when.tzinfo is None:
        raise ValueError(f"--until {text!r} has no time zone: add one, like Z for UTC")
    return when.isoformat()


def check_uses(value: int) -> int:
    """A positive number of uses (ValueError otherwise)."""
    if value < 1:
        raise ValueError(f"--uses {value}: a grant allows at least one use")
    return value


def run_requests_command(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    command = args.requests_command
    chosen_id: str | None = getattr(args, "id", None)
    if chosen_id is not None and not chosen_id.strip():
        # `approve "$ID"` with ID unset: say so, not the admin API's "no such endpoint".
        what = "grant" if command == "revoke" else "request"
        print(f"sandgate: an empty {what} id: `sandgate requests list` shows them", file=sys.stderr)
        return EXIT_USAGE
    try:
        if command == "list":
            listing = admin_client.access_requests(config)
            _emit(args.format, listing, _table(listing.get("requests", []), listing.get("unanswered", [])))
            return EXIT_OK
        if command == "show":
            found = admin_client.access_request(config, args.id)
            _emit(args.format, found, _detail(found))
            return EXIT_OK
        if command == "grants":
            listing = admin_client.grants(config)
            _emit(args.format, listing, _grants_table(listing.get("grants", [])))
            return EXIT_OK
        if command == "revoke":
            revoked = admin_client.revoke_grant(config, args.id, by=_user())
            _emit(args.format, revoked, f"{revoked['id']}: revoked ({_grant_what(revoked)})")
            return EXIT_OK
        approve = command == "approve"
        try:
            ttl = parse_duration(args.ttl) if approve and args.ttl is not None else None
            until = parse_until(args.until) if approve and args.until is not None else None
            uses = check_uses(args.uses) if approve and args.uses is not None else None
        except ValueError as e:
            print(f"sandgate: {e}", file=sys.stderr)
            return EXIT_USAGE
        decided = admin_client.decide_access_request(
            config,
            args.id,
            approve=approve,
            by=_user(),
            reason=args.reason,
            scope=args.scope if approve else None,
            ttl_seconds=ttl,
            any_arguments=approve and bool(args.any_arguments),
            max_uses=uses,
            expires_at=until,
        )
        _emit(args.format, decided, _decided(decided))
        return EXIT_OK
    except admin_client.GatewayNotRunning as e:
        print(f"sandgate: {e}", file=sys.stderr)
        return EXIT_USAGE
    except admin_client.AdminApiError as e:
        print(f"sandgate: {e.message}", file=sys.stderr)
        return EXIT_REFUSED if e.status in (404, 409) else EXIT_USAGE


def _user() -> str | None:
    """Who decides: the operating-system user running the command."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return None


def _what(r: dict[str, Any]) -> str:
    where = f"{r.get('host')}:{r.get('port')}"
    if r.get("kind") == "proposal":
        methods = ",".join(r.get("methods") or []) or "any method"
        paths = ",".join(r.get("paths") or []) or "any path"
        return f"proposal: {methods} {where} {paths}"
    if r.get("method"):
        line = f"{r['method']} {where}{r.get('path') or ''}"
        calls = r.get("tool_calls") or []
        if calls:
            # A held MCP body: the tool it asks to call (how many, for a batch).
            line += f" tool {r.get('tool')}" + (f" (+{len(calls) - 1} more)" if len(calls) > 1 else "")
        return line
    return f"CONNECT {where}"


def _decided(d: dict[str, Any]) -> str:
    line = f"{d['id']}: {d['state']} by {d.get('by') or '-'}"
    if d.get("scope"):
        line += f" (scope {d['scope']})"
    grant = d.get("grant")
    if isinstance(grant, dict):
        until = grant.get("expires") or "revoked"
        uses = f", {grant['max_uses']} uses" if grant.get("max_uses") is not None else ""
        line += f"\ngranted: {_grant_what(grant)}, until {until}{uses} ({grant.get('origin')})"
    return line


def _grant_what(g: dict[str, Any]) -> str:
    who = g.get("sandbox") or f"tenant {g.get('tenant')}"
    methods = ",".join(g.get("methods") or []) or "any method"
    paths = ",".join(g.get("paths") or []) or "any path"
    line = f"{who}: {methods} {g.get('host')}:{g.get('port')} {paths}"
    if g.get("tool"):
        digest = g.get("arguments_sha256")
        arguments = f"arguments sha256:{digest[:12]}..." if digest else "any arguments"
        if g.get("arguments"):
            arguments += f", {len(g['arguments'])} predicates"
        line += f" tool {g['tool']} ({arguments})"
    return line


def _aligned(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """A header line and rows under it, each column as wide as its widest cell (the last one
    unpadded), non-printable characters escaped."""
    cells = [[clean(c) for c in row] for row in (header, *rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header) - 1)]
    return ["  ".join([*(c.ljust(w) for c, w in zip(row, widths, strict=False)), row[-1]]) for row in cells]


def _grants_table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "no grants"
    header = ("id", "scope", "until", "uses", "grant")
    table = [
        (
            g["id"],
            g["scope"],
            (g.get("expires") or "-") + (" (expired)" if g.get("expired") else ""),
            _uses(g),
            _grant_what(g),
        )
        for g in rows
    ]
    return "\n".join(_aligned(header, table))


def _uses(g: dict[str, Any]) -> str:
    """A grant's uses as listed: `1/3`, `3/3 (exhausted)`, `?/3` (the count out of reach), `-`."""
    if g.get("max_uses") is None:
        return "-"
    used = g.get("uses")
    text = f"{used if used is not None else '?'}/{g['max_uses']}"
    return text + (" (exhausted)" if g.get("exhausted") else "")


def _table(rows: list[dict[str, Any]], unanswered: list[dict[str, Any]]) -> str:
    header: tuple[str, ...] = ("id", "state", "created", "tenant/sandbox", "request")
    table: list[tuple[str, ...]] = [
        (r["id"], r["state"], r["created"], f"{r['tenant']}/{r['sandbox']}", _what(r)) for r in rows
    ]
    if any(r.get("gateway") for r in rows):
        # A fleet: which gateway holds each (a decision from here is handed to it).
        header += ("gateway",)
        table = [(*row, str(r.get("gateway") or "-")) for row, r in zip(table, rows, strict=True)]
    lines = _aligned(header, table) if rows else ["no requests are held"]
    lines.extend(
        f"note: {w.get('error') or 'worker ' + str(w.get('index')) + ' did not answer'}" for w in unanswered
    )
    return "\n".join(lines)


def _detail(r: dict[str, Any]) -> str:
    # `note`: a proposal's reason text, as the guest wrote it (cleaned).
    fields = (
        *("id", "state", "tenant", "sandbox", "phase", "rule_id", "created"),
        *("by", "reason", "decided", "note"),
    )
    lines = [f"{name}: {r.get(name) if r.get(name) is not None else '-'}" for name in fields]
    lines.insert(5, f"request: {_what(r)}")
    # A held tool call: each asked call, its arguments' digest and a preview of them (canonical
    # JSON, placeholders masked, cut at 1 KiB), the guest's data: escaped by `clean`.
    for i, call in enumerate(r.get("tool_calls") or []):
        lines.append(f"tool: {clean(str(call.get('tool')))}" + (f" (call {i + 1})" if i else ""))
        lines.append(f"  arguments_sha256: {call.get('arguments_sha256')}")
        lines.append(f"  arguments: {clean(str(call.get('arguments_preview')))}")
    return "\n".join(lines)


def _emit(fmt: str, value: dict[str, Any], text: str) -> None:
    print(json.dumps(value, indent=2) if fmt == "json" else text)
