"""Audit records as text: JSON lines, or fixed-width table rows safe to print on a terminal.

Table cells are streamed, so widths are fixed per column; a longer value pushes the rest of
its row right instead of being cut. A decision row is about 110 columns before its rule id:
the time to the second (the JSON has milliseconds), the phase (a passed-through TLS connection
has a `connect` and a `tls` record), the request as one cell (`GET host:port/path`), and the
credentials injected and the MCP tools called after the rule id.
Every cell has its non-printable characters escaped: paths and hosts come from sandboxes and
must not reach a terminal as control sequences.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from sandgate.proxy.audit.calls import calls
from sandgate.proxy.audit.ocsf.events import ocsf_events
from sandgate.proxy.audit.query import Record

__all__ = ["clean", "json_line", "ocsf_lines", "table_header", "table_row"]

_DECISION_COLUMNS = (
    ("time", 20),
    ("decision", 10),
    ("phase", 7),
    ("reason", 18),
    ("tenant/sandbox", 14),
    ("request", 26),
    ("rule_id", 0),  # and `credentials=a,b` when some were injected
)
_RELOAD_COLUMNS = (
    ("time", 20),
    ("trigger", 12),
    ("result", 8),
    ("old_version", 14),
    ("policy_version", 14),
    ("errors", 0),
)


def clean(value: object) -> str:
    """A value as printable text: None as `-`, control and other non-printable characters escaped."""
    text = "-" if value is None or value == "" else str(value)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def json_line(record: Record) -> str:
    """A record as one compact JSON line (non-ASCII escaped)."""
    return json.dumps(record, separators=(",", ":"), default=str)


def ocsf_lines(record: Record) -> list[str]:
    """A record's OCSF events (sandgate.proxy.audit.ocsf), one compact JSON line each."""
    return [json_line(event) for event in ocsf_events(record)]


def _columns(event: str) -> tuple[tuple[str, int], ...]:
    """The table columns for records of one event type."""
    return _RELOAD_COLUMNS if event == "policy_reload" else _DECISION_COLUMNS


def _row(cells: list[str], columns: tuple[tuple[str, int], ...]) -> str:
    """Cells padded to their column widths, two spaces apart."""
    return "  ".join(c.ljust(w) for c, (_, w) in zip(cells, columns, strict=True)).rstrip()


def table_header(event: str) -> str:
    """The header line of a table of `event` records."""
    columns = _columns(event)
    return _row([name for name, _ in columns], columns)


def _host_port(dest: Mapping[str, Any]) -> str:
    """`host:port` of a destination (`[v6]:port` for an IPv6 literal)."""
    host = dest.get("host") or dest.get("ip")
    port = dest.get("port")
    if host is None:
        return "-"
    host = f"[{host}]" if ":" in str(host) else str(host)
    return f"{host}:{port}" if port is not None else host


_SECONDS = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)\.\d+Z$")


def _time(value: object) -> str:
    """A record's time to the second (`2026-11-30T10:00:00Z`); any other value as it is."""
    found = _SECONDS.match(value) if isinstance(value, str) else None
    return found.group(1) + "Z" if found else clean(value)


def _request(record: Record) -> str:
    """What was asked, in one cell: `METHOD host:port/path`, or `host:port` without a method."""
    dest = record.get("dest")
    where = _host_port(dest) if isinstance(dest, Mapping) else "-"
    method, path = record.get("method"), record.get("path")
    text = where + (str(path) if path else "")
    return clean(f"{method} {text}" if method else text)


def _rule(record: Record) -> str:
    """The rule that decided, the credentials the gateway injected (`credentials=a,b`) and the
    MCP tools called (`tools=a,b`, the first 8)."""
    credentials = record.get("credentials")
    text = clean(record.get("rule_id"))
    if isinstance(credentials, list) and credentials:
        text += " credentials=" + clean(",".join(map(str, credentials)))
    tools = [c.tool for c in calls(record) if c.tool is not None]
    if tools:
        text += " tools=" + clean(",".join(tools[:8]) + (",..." if len(tools) > 8 else ""))
    return text


def _decision_cells(record: Record) -> list[str]:
    """The table cells of a decision record."""
    return [
        _time(record.get("time")),
        clean(record.get("decision")),
        clean(record.get("phase")),
        clean(record.get("reason")),
        f"{clean(record.get('tenant'))}/{clean(record.get('sandbox'))}",
        _request(record),
        _rule(record),
    ]


def _reload_cells(record: Record) -> list[str]:
    """The table cells of a policy_reload record."""
    errors = record.get("errors")
    return [
        _time(record.get("time")),
        clean(record.get("trigger")),
        clean(record.get("result")),
        clean(record.get("old_version")),
        clean(record.get("policy_version")),
        clean("; ".join(map(str, errors)) if isinstance(errors, list) else errors),
    ]


def table_row(record: Record, event: str) -> str:
    """One record as a table row."""
    cells = _reload_cells(record) if event == "policy_reload" else _decision_cells(record)
    return _row(cells, _columns(event))
