"""Per-tenant counts over decision records: by decision, by reason, top denied hosts and reasons.

"Denied" means `deny` and `would_deny` (report mode), so a tenant being tuned in report mode
shows what enforcement would refuse. Memory grows with distinct tenants, reasons and denied
hosts, never with the number of records.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sandgate.proxy.audit.format import clean
from sandgate.proxy.audit.query import Record, dest_host

__all__ = ["TenantStats", "collect", "stats_document", "stats_table"]

DENIED = frozenset({"deny", "would_deny"})


@dataclass(slots=True)
class TenantStats:
    """Counters of one tenant's decision records."""

    records: int = 0
    decisions: Counter[str] = field(default_factory=Counter)
    reasons: Counter[str] = field(default_factory=Counter)
    denied_hosts: Counter[str] = field(default_factory=Counter)
    denial_reasons: Counter[str] = field(default_factory=Counter)

    def add(self, record: Record) -> None:
        """Count one record."""
        decision, reason = str(record.get("decision")), str(record.get("reason"))
        self.records += 1
        self.decisions[decision] += 1
        self.reasons[reason] += 1
        if decision in DENIED:
            self.denied_hosts[dest_host(record) or "-"] += 1
            self.denial_reasons[reason] += 1


def collect(records: Iterable[Record]) -> dict[str | None, TenantStats]:
    """Counters per tenant (None: connections without an identity)."""
    stats: dict[str | None, TenantStats] = {}
    for record in records:
        tenant = record.get("tenant")
        key = tenant if isinstance(tenant, str) else None
        stats.setdefault(key, TenantStats()).add(record)
    return stats


def _ranked(counter: Counter[str], top: int | None = None) -> list[tuple[str, int]]:
    """Entries by count, highest first, ties by name; the first `top` only when given."""
    ranked = sorted(counter.items(), key=lambda kv: (-kv[1], kv[0]))
    return ranked if top is None else ranked[:top]


def _tenant_document(tenant: str | None, s: TenantStats, top: int) -> dict[str, Any]:
    """One tenant's entry in the stats document."""
    return {
        "tenant": tenant,
        "records": s.records,
        "decisions": dict(_ranked(s.decisions)),
        "reasons": dict(_ranked(s.reasons)),
        "top_denied_hosts": [{"host": h, "count": c} for h, c in _ranked(s.denied_hosts, top)],
        "top_reasons": [{"reason": r, "count": c} for r, c in _ranked(s.denial_reasons, top)],
    }


def stats_document(stats: dict[str | None, TenantStats], top: int) -> dict[str, Any]:
    """The stats as one JSON-ready document, tenants by name (no identity last)."""
    order = sorted(stats, key=lambda t: (t is None, t or ""))
    return {
        "records": sum(s.records for s in stats.values()),
        "tenants": [_tenant_document(t, stats[t], top) for t in order],
    }


def _counts_line(label: str, counts: dict[str, int]) -> str:
    """`label: a 3, b 1` (or `label: -`)."""
    text = ", ".join(f"{clean(k)} {v}" for k, v in counts.items())
    return f"  {label}: {text or '-'}"


def _top_lines(label: str, entries: list[dict[str, Any]], key: str) -> list[str]:
    """A titled list of `count  name` lines, counts right-aligned."""
    if not entries:
        return [f"  {label}: -"]
    width = max(len(str(e["count"])) for e in entries)
    return [f"  {label}:"] + [f"    {e['count']:>{width}}  {clean(e[key])}" for e in entries]


def stats_table(document: dict[str, Any]) -> list[str]:
    """The stats document as text lines, one block per tenant."""
    lines = [f"{document['records']} decision records"]
    for t in document["tenants"]:
        name = clean(t["tenant"]) if t["tenant"] is not None else "- (no identity)"
        lines += ["", f"tenant {name}: {t['records']} records"]
        lines.append(_counts_line("decisions", t["decisions"]))
        lines.append(_counts_line("reasons", t["reasons"]))
        lines += _top_lines("top denied hosts", t["top_denied_hosts"], "host")
        lines += _top_lines("top denial reasons", t["top_reasons"], "reason")
    return lines
