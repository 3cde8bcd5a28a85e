"""`sandgate requests list|show ID|approve ID|deny ID [--reason TEXT]`: requests held for a
decision (`ask` rules), through the running gateway's admin API. A decision is scope `once`:
it releases (or refuses) that one request; it changes no rule.

Exit 0: done. 1: no such request, or it was already decided. 2: no gateway answers, or usage.
"""

from __future__ import annotations

import argparse
import getpass
import json
import sys
from typing import Any

from sandgate.proxy.admin import client as admin_client
from sandgate.proxy.config import load_config

__all__ = ["run_requests_command"]

EXIT_OK, EXIT_REFUSED, EXIT_USAGE = 0, 1, 2


def run_requests_command(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    command = args.requests_command
    try:
        if command == "list":
            listing = admin_client.access_requests(config)
            _emit(args.format, listing, _table(listing.get("requests", []), listing.get("unanswered", [])))
            return EXIT_OK
        if command == "show":
            found = admin_client.access_request(config, args.id)
            _emit(args.format, found, _detail(found))
            return EXIT_OK
        decided = admin_client.decide_access_request(
            config, args.id, approve=command == "approve", by=_user(), reason=args.reason
        )
        _emit(args.format, decided, f"{decided['id']}: {decided['state']} by {decided.get('by') or '-'}")
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
    if r.get("method"):
        return f"{r['method']} {where}{r.get('path') or ''}"
    return f"CONNECT {where}"


def _table(rows: list[dict[str, Any]], unanswered: list[dict[str, Any]]) -> str:
    lines = [
        f"{r['id']}  {r['state']:<11}  {r['tenant']}/{r['sandbox']}  {_what(r)}  ({r['created']})"
        for r in rows
    ]
    if not rows:
        lines.append("no requests are held")
    lines.extend(
        f"note: {w.get('error') or 'worker ' + str(w.get('index')) + ' did not answer'}" for w in unanswered
    )
    return "\n".join(lines)


def _detail(r: dict[str, Any]) -> str:
    fields = ("id", "state", "tenant", "sandbox", "phase", "rule_id", "created", "by", "reason", "decided")
    lines = [f"{name}: {r.get(name) if r.get(name) is not None else '-'}" for name in fields]
    lines.insert(5, f"request: {_what(r)}")
    return "\n".join(lines)


def _emit(fmt: str, value: dict[str, Any], text: str) -> None:
    print(json.dumps(value, indent=2) if fmt == "json" else text)
