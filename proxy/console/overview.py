"""The overview page's figures, from the audit trail over a chosen window: decisions per
second (allowed and denied, in time buckets), denials by reason and the top denied hosts of
each tenant (the counters of `sandgate audit stats`). In a fleet the trail is the fleet's
audit stream, so the figures are the whole fleet's."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sandgate.proxy.audit.files import Source
from sandgate.proxy.audit.query import AuditInputError, Query, Record, record_time
from sandgate.proxy.audit.stats import DENIED, collect, stats_document

__all__ = ["BUCKETS", "WINDOWS", "Overview", "read_overview"]

# The windows offered, by name: seconds.
WINDOWS = {"5m": 300, "15m": 900, "1h": 3600, "6h": 6 * 3600, "24h": 86400}
BUCKETS = 60
TOP = 5


@dataclass(slots=True)
class Overview:
    """What the overview shows for one window."""

    window: str
    since: datetime
    bucket_seconds: float
    allowed: list[int] = field(default_factory=lambda: [0] * BUCKETS)
    denied: list[int] = field(default_factory=lambda: [0] * BUCKETS)
    records: int = 0
    denial_reasons: list[tuple[str, int]] = field(default_factory=list)
    tenants: list[dict[str, Any]] = field(default_factory=list)
    # Why the trail could not be read (no file yet, the fleet stream unreachable): said, not hidden.
    unread: str | None = None

    def per_second(self, counts: list[int]) -> list[float]:
        return [c / self.bucket_seconds for c in counts]

    def count(self, record: Record) -> None:
        """Put one decision record in its time bucket."""
        moment = record_time(record)
        if moment is None:
            return
        index = int((moment - self.since).total_seconds() // self.bucket_seconds)
        if 0 <= index < BUCKETS:
            denied = record.get("decision") in DENIED
            (self.denied if denied else self.allowed)[index] += 1


def _counted(records: Iterable[Record], overview: Overview) -> Iterator[Record]:
    for record in records:
        overview.count(record)
        yield record


def read_overview(source: Source, window: str, now: datetime) -> Overview:
    """The overview of the trail `source` reads over the window named `window` ending `now`
    (blocking: run it in a thread)."""
    seconds = WINDOWS[window]
    since = now - timedelta(seconds=seconds)
    overview = Overview(window=window, since=since, bucket_seconds=seconds / BUCKETS)
    try:
        with contextlib.closing(source.records(Query(since=since, until=now))) as records:
            stats = collect(_counted(records, overview))
    except AuditInputError as e:
        overview.unread = str(e)
        return overview
    document = stats_document(stats, TOP)
    reasons: Counter[str] = Counter()
    for s in stats.values():
        reasons.update(s.denial_reasons)
    overview.records = document["records"]
    overview.denial_reasons = sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))[:10]
    overview.tenants = [t for t in document["tenants"] if t["top_denied_hosts"]]
    return overview
