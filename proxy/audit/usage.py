"""Usage per hour and per sandbox (or tenant) over decision records, for billing and capacity.

What each column counts, from the decision records the gateway writes:

- `requests`: records of phase `request` (one per HTTP request, WebSocket or agent-protocol
  message), except the `ask` record a held request writes when it starts waiting: its end
  record is the request. `connections`: records of every other phase (`connect`, `tls`,
  `dns`): connections and tunnels, counted apart because one carries many requests.
- `allowed`: `allow` and `would_deny` (report mode lets it through); `denied`: `deny`.
  Connections count in these too.
- `bytes_up`, `bytes_down`: the `bytes` of every record that has them (completed requests).
- `upstream_ms`: the sum of `duration_ms` of allowed requests, less the seconds each was held
  for an approval: from the gateway reading the request to its completed response, the time
  the gateway spent on the sandbox's behalf (upstream connect and response included).
- `approvals`: requests held for an approval (their `ask` records); `approval_wait_seconds`:
  the sum of `approval.waited_seconds` of the held requests' end records.
- `credentials`: how many requests each credential was injected into, by name.

Hours are UTC (`2026-12-03T04:00Z`), by the record's `time`. A record whose time or fields
cannot be read is counted in `skipped` and left out. Memory grows with hours × sandboxes,
never with records.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from sandgate.proxy.audit.query import Record, record_time

__all__ = ["COLUMNS", "By", "HourUsage", "UsageCollector", "hour_bucket"]

type By = Literal["sandbox", "tenant"]

ALLOWED = frozenset({"allow", "would_deny"})
DENIED = frozenset({"deny"})
ASK = "ask"
REQUEST = "request"
COUNTS = (
    "requests",
    "connections",
    "allowed",
    "denied",
    "bytes_up",
    "bytes_down",
    "upstream_ms",
    "approvals",
    "approval_wait_seconds",
)
COLUMNS = ("hour", "tenant", "sandbox", *COUNTS, "credentials")


def hour_bucket(moment: datetime) -> str:
    """The UTC hour a moment falls in, as `2026-12-03T04:00Z`."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:00Z")


@dataclass(slots=True)
class HourUsage:
    """One hour's usage of one sandbox (or tenant)."""

    requests: int = 0
    connections: int = 0
    allowed: int = 0
    denied: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    upstream_ms: float = 0.0
    approvals: int = 0
    approval_wait_seconds: float = 0.0
    credentials: Counter[str] = field(default_factory=Counter)

    def add(self, record: Record) -> None:
        """Count one decision record (already checked by `_readable`)."""
        decision = record.get("decision")
        if decision == ASK:
            self.approvals += 1
            return
        waited = _waited(record)
        self.approval_wait_seconds += waited
        if decision in ALLOWED:
            self.allowed += 1
        elif decision in DENIED:
            self.denied += 1
        sent = record.get("bytes")
        if isinstance(sent, Mapping):
            self.bytes_up += _whole(sent.get("up"))
            self.bytes_down += _whole(sent.get("down"))
        for name in record.get("credentials") or ():
            self.credentials[name] += 1
        if record.get("phase") != REQUEST:
            self.connections += 1
            return
        self.requests += 1
        if decision in ALLOWED:
            self.upstream_ms += max(0.0, _number(record.get("duration_ms")) - waited * 1000)


def _whole(value: object) -> int:
    """A byte count, 0 when absent or not a count."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _number(value: object) -> float:
    """A non-negative number, 0 when absent or not a number."""
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return float(value)
    return 0.0


def _waited(record: Record) -> float:
    """Seconds a held request waited (its end record's `approval.waited_seconds`), else 0."""
    approval = record.get("approval")
    return _number(approval.get("waited_seconds")) if isinstance(approval, Mapping) else 0.0


def _readable(record: Record) -> bool:
    """Whether the fields counted have the types the gateway writes."""
    credentials = record.get("credentials")
    if credentials is not None and not (
        isinstance(credentials, list) and all(isinstance(c, str) for c in credentials)
    ):
        return False
    return all(
        record.get(key) is None or isinstance(record.get(key), str)
        for key in ("tenant", "sandbox", "decision", "phase")
    )


class UsageCollector:
    """Usage per (hour, tenant, sandbox) over decision records; `by="tenant"` sums sandboxes."""

    def __init__(self, by: By = "sandbox") -> None:
        self.by = by
        self.skipped = 0
        self._buckets: dict[tuple[str, str | None, str | None], HourUsage] = {}

    def add(self, record: Record) -> None:
        """Count one record; a non-decision record is ignored, an unreadable one skipped."""
        if record.get("event") != "decision":
            return
        moment = record_time(record)
        if moment is None or not _readable(record):
            self.skipped += 1
            return
        sandbox = record.get("sandbox") if self.by == "sandbox" else None
        key = (hour_bucket(moment), record.get("tenant"), sandbox)
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = HourUsage()
        bucket.add(record)

    def add_all(self, records: Iterable[Record]) -> UsageCollector:
        """Count every record; returns self."""
        for record in records:
            self.add(record)
        return self

    def rows(self) -> list[dict[str, Any]]:
        """One row per hour and sandbox (or tenant), by hour then name; no identity as None, last."""
        order = sorted(
            self._buckets, key=lambda k: (k[0], k[1] is None, k[1] or "", k[2] is None, k[2] or "")
        )
        return [self._row(key) for key in order]

    def _row(self, key: tuple[str, str | None, str | None]) -> dict[str, Any]:
        hour, tenant, sandbox = key
        usage = self._buckets[key]
        row: dict[str, Any] = {"hour": hour, "tenant": tenant}
        if self.by == "sandbox":
            row["sandbox"] = sandbox
        for name in COUNTS:
            row[name] = getattr(usage, name)
        row["upstream_ms"] = round(usage.upstream_ms, 3)
        row["approval_wait_seconds"] = round(usage.approval_wait_seconds, 3)
        row["credentials"] = dict(sorted(usage.credentials.items()))
        return row
