"""Audit records as text: JSON lines, or fixed-width table rows safe to print on a terminal.

Table cells are streamed, so widths are fixed per column; a longer value pushes the rest of
its row right instead of being cut. Every cell has its non-printable characters escaped:
paths and hosts come from sandboxes and must not reach a terminal as control sequences.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from sandgate.proxy.audit.query import Record

__all__ = ["clean", "json_line", "table_header", "table_row"]

_DECISION_COLUMNS = (
    ("time", 24),
    ("decision", 10),
    ("reason", 24),
    ("tenant/sandbox", 20),
    ("method", 7),
    ("host:port", 30),
    ("path", 30),
    ("rule_id", 24),
    ("credentials", 0),
)
_RELOAD_COLUMNS = (
    ("time", 24),
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


def _decision_cells(record: Record) -> list[str]:
    """The table cells of a decision record."""
    dest = record.get("dest")
    credentials = record.get("credentials")
    return [
        clean(record.get("time")),
        clean(record.get("decision")),
        clean(record.get("reason")),
        f"{clean(record.get('tenant'))}/{clean(record.get('sandbox'))}",
        clean(record.get("method")),
        clean(_host_port(dest) if isinstance(dest, Mapping) else None),
        clean(record.get("path")),
        clean(record.get("rule_id")),
        clean(",".join(map(str, credentials)) if isinstance(credentials, list) else None),
    ]


def _reload_cells(record: Record) -> list[str]:
    """The table cells of a policy_reload record."""
    errors = record.get("errors")
    return [
        clean(record.get("time")),
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
