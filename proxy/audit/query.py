"""Which audit records to select: field filters and a time window, as one immutable `Query`.

A record matches when every filter that is set matches (AND across fields); a filter given
several values matches any of them (OR within a field). The window is `since <= time < until`.
A record whose `time` cannot be read never matches a query with a window.

`tools` and `rpc_methods` are globs (`*`, `?`, any case) on the calls of an agent-protocol
record (sandgate.proxy.audit.calls): a record matches when one of its messages calls a
matching tool (an MCP `tools/call`), or has a matching method (MCP or JSON-RPC).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sandgate.proxy.audit.calls import calls, glob_matches
from sandgate.proxy.errors import ProxyError

__all__ = [
    "ANY_EVENT",
    "AuditInputError",
    "Query",
    "Record",
    "dest_host",
    "host_matches",
    "line_filter",
    "parse_time",
    "record_time",
]

Record = Mapping[str, Any]

_RELATIVE = re.compile(r"^(\d{1,9})([smhdw])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


class AuditInputError(ProxyError):
    """An audit command that cannot run as asked: a bad time, a missing file (exit 2)."""


def parse_time(text: str, now: datetime) -> datetime:
    """An RFC 3339 time (UTC when no offset is given) or a span before `now`: `15m`, `2h`, `1d`."""
    relative = _RELATIVE.match(text.strip())
    if relative:
        return now - timedelta(**{_UNITS[relative.group(2)]: int(relative.group(1))})
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise AuditInputError(
            f"{text!r} is not a time: use RFC 3339 (2026-11-30T01:04:41Z) or a span (15m, 2h, 1d)"
        ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def record_time(record: Record) -> datetime | None:
    """A record's `time` (RFC 3339 as written, or epoch seconds), or None when unreadable."""
    value = record.get("time")
    try:
        if isinstance(value, str):
            moment = datetime.fromisoformat(value)
            return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return datetime.fromtimestamp(value, UTC)
    except (ValueError, OverflowError, OSError):
        return None
    return None


def dest_host(record: Record) -> str | None:
    """The destination host of a decision record (its IP when no name is known)."""
    dest = record.get("dest")
    if not isinstance(dest, Mapping):
        return None
    host = dest.get("host") or dest.get("ip")
    return host if isinstance(host, str) else None


def host_matches(pattern: str, host: str) -> bool:
    """Whether `host` is `pattern`, or a strict subdomain of it when it is `*.suffix` (as in policy)."""
    host = host.lower()
    if pattern.startswith("*."):
        return host.endswith(pattern[1:])
    return host == pattern


def _needle(value: str, *, suffix: bool = False) -> bytes | None:
    """Bytes every JSON line holding `value` as a string contains, or None when that is uncertain."""
    encoded = json.dumps(value)
    if encoded != f'"{value}"':
        # Escaped characters may be written more than one way: do not prefilter on them.
        return None
    return encoded[1:].encode() if suffix else encoded.encode()


# `Query.event` selecting records of every event (a SIEM export: `--event any --format ocsf`).
ANY_EVENT = "any"


@dataclass(frozen=True, slots=True)
class Query:
    """A selection of audit records; empty filters select everything of `event`."""

    event: str = "decision"
    tenants: frozenset[str] = frozenset()
    sandboxes: frozenset[str] = frozenset()
    hosts: tuple[str, ...] = ()
    reasons: frozenset[str] = frozenset()
    decisions: frozenset[str] = frozenset()
    phases: frozenset[str] = frozenset()
    credentials: frozenset[str] = frozenset()
    # Records tied to these access requests (sandgate.proxy.approvals), of every event: the one
    # that asked, the grant made, the release, the requests a grant allowed, its end.
    approvals: frozenset[str] = frozenset()
    # Globs on the tools and methods of agent-protocol messages (`mcp`, `jsonrpc` records).
    tools: tuple[str, ...] = ()
    rpc_methods: tuple[str, ...] = ()
    since: datetime | None = None
    until: datetime | None = None

    @property
    def windowed(self) -> bool:
        """Whether the query has a time window."""
        return self.since is not None or self.until is not None

    def matches(self, record: Record) -> bool:
        """Whether the record is selected (cheap field checks first, the time last)."""
        if self.approvals:
            if not self._approval_ok(record):
                return False
        elif self.event != ANY_EVENT and record.get("event") != self.event:
            return False
        for values, key in (
            (self.tenants, "tenant"),
            (self.sandboxes, "sandbox"),
            (self.reasons, "reason"),
            (self.decisions, "decision"),
            (self.phases, "phase"),
        ):
            if values and record.get(key) not in values:
                return False
        if self.hosts and not self._host_ok(record):
            return False
        if self.credentials and not self._credentials_ok(record):
            return False
        if (self.tools or self.rpc_methods) and not self._calls_ok(record):
            return False
        return not self.windowed or self.in_window(record_time(record))

    def in_window(self, moment: datetime | None) -> bool:
        """Whether a record time lies in the window (an unreadable time never does)."""
        if moment is None:
            return False
        if self.since is not None and moment < self.since:
            return False
        return self.until is None or moment < self.until

    def _host_ok(self, record: Record) -> bool:
        """Whether the destination host matches one of the host filters."""
        host = dest_host(record)
        return host is not None and any(host_matches(p, host) for p in self.hosts)

    def _approval_ok(self, record: Record) -> bool:
        """Whether the record belongs to one of the wanted access requests' chains."""
        if record.get("approval_id") in self.approvals:
            return True
        approval = record.get("approval")
        if isinstance(approval, Mapping) and approval.get("id") in self.approvals:
            return True
        rule_id = record.get("rule_id")
        # A request a grant allowed names the grant's rule: `<tenant>/grant/<approval id>`.
        return isinstance(rule_id, str) and rule_id.rpartition("/grant/")[2] in self.approvals

    def _credentials_ok(self, record: Record) -> bool:
        """Whether the record's `credentials` list names one of the wanted credentials."""
        used = record.get("credentials")
        return isinstance(used, list) and any(name in self.credentials for name in used)

    def _calls_ok(self, record: Record) -> bool:
        """Whether the record has a call of a wanted tool and one with a wanted method."""
        sent = list(calls(record))
        if self.tools and not any(
            c.tool is not None and any(glob_matches(p, c.tool) for p in self.tools) for c in sent
        ):
            return False
        return not self.rpc_methods or any(
            c.method is not None and any(glob_matches(p, c.method) for p in self.rpc_methods) for c in sent
        )

    def needles(self) -> tuple[tuple[bytes, ...], ...]:
        """For each filter, byte strings of which a matching JSON line contains at least one.

        A file source uses them to skip lines without decoding them. They are a necessary
        condition only (a field name may hold the value too): `matches` decides.
        """
        values = (
            [] if self.approvals or self.event == ANY_EVENT else [self.event],
            self.tenants,
            self.sandboxes,
            self.reasons,
            self.decisions,
            self.phases,
            self.credentials,
        )
        groups = [tuple(_needle(v) for v in sorted(vs)) for vs in values if vs]
        if self.hosts:
            groups.append(tuple(_host_needle(p) for p in self.hosts))
        # Globs match in any case: only the field a matching record must have.
        if self.tools:
            groups.append((b'"tool"',))
        if self.rpc_methods:
            groups.append((b'"messages"',))
        if self.approvals:
            # The id ends a string: `approval_id`, `approval.id`, or a grant's rule id.
            groups.append(tuple(_needle(a, suffix=True) for a in sorted(self.approvals)))
        # A filter with a value that has no reliable needle cannot rule a line out.
        return tuple(tuple(n for n in g if n is not None) for g in groups if None not in g)


def line_filter(query: Query) -> Callable[[bytes], bool]:
    """A fast test on raw JSON lines: False means the line cannot hold a selected record."""
    groups = query.needles()
    if all(len(g) == 1 for g in groups):
        singles = tuple(g[0] for g in groups)
        return lambda line: all(n in line for n in singles)
    return lambda line: all(any(n in line for n in g) for g in groups)


def _host_needle(pattern: str) -> bytes | None:
    """The needle of a host filter: the exact name, or `.suffix"` for `*.suffix`."""
    if pattern.startswith("*."):
        return _needle(pattern[1:], suffix=True)
    return _needle(pattern)
