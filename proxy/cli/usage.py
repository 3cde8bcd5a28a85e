"""`sandgate usage`: requests, bytes, upstream time, approvals and credentials per hour and per
sandbox (or tenant), from the audit trail (sandgate.proxy.audit.usage says what each counts).

Exit codes: 0 ok (also when nothing matched), 2 usage or invalid input (a bad time, no audit
file). Malformed lines and unreadable records are skipped and counted on stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import sys
from datetime import UTC, datetime
from typing import Any

from sandgate.proxy.audit.format import clean
from sandgate.proxy.audit.query import Query, parse_time
from sandgate.proxy.audit.usage import COLUMNS, UsageCollector
from sandgate.proxy.cli.audit import open_source

__all__ = ["render", "run_usage_command"]

EXIT_OK = 0


def run_usage_command(args: argparse.Namespace) -> int:
    """Run `sandgate usage`."""
    now = datetime.now(UTC)
    query = Query(
        event="decision",
        since=parse_time(args.since, now) if args.since else None,
        until=parse_time(args.until, now) if args.until else None,
    )
    source = open_source(args)
    collector = UsageCollector(args.by)
    with contextlib.closing(source.records(query)) as records:
        collector.add_all(records)
    sys.stdout.write(render(collector.rows(), args.by, args.format))
    skipped = source.malformed + collector.skipped
    if skipped:
        plural = "" if skipped == 1 else "s"
        print(f"sandgate usage: skipped {skipped} malformed line{plural} or record{plural}", file=sys.stderr)
    return EXIT_OK


def _columns(by: str) -> tuple[str, ...]:
    return COLUMNS if by == "sandbox" else tuple(c for c in COLUMNS if c != "sandbox")


def _cell(value: Any) -> str:
    """A row's value as text: None as `-`, credentials as `name=count;…`."""
    if isinstance(value, dict):
        return ";".join(f"{k}={v}" for k, v in value.items())
    if isinstance(value, float):
        return f"{value:g}" if value != int(value) else str(int(value))
    return "" if value is None else str(value)


def render(rows: list[dict[str, Any]], by: str, fmt: str) -> str:
    """The rows as `json` (an array), `csv` (with a header row) or an aligned `table`."""
    if fmt == "json":
        return json.dumps(rows, indent=2) + "\n"
    columns = _columns(by)
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows([_cell(row[c]) for c in columns] for row in rows)
        return out.getvalue()
    table = [list(columns)] + [[clean(_cell(row[c])) for c in columns] for row in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(columns))]
    return "".join(
        "  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip() + "\n" for line in table
    )
