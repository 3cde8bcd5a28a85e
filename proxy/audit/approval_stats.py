"""Per-sandbox approval counts over the audit trail (`sandgate audit stats`): asks by outcome,
the time held (p50, p99, max) and the grants made.

Read from the records the gateway writes: an `ask` decision record per held request; its end
record (with `approval: {id, by, waited_seconds}`) whose reason says how it ended; a refusal
with `approval_queue_full` for an ask past the cap; and a `grant` record (`action: made`)
per grant an approval made, a tenant-wide one counted under sandbox `*`. Times are counted in
log-spaced bins (5 % wide), so memory grows with sandboxes and never with records; a
percentile is its bin's upper edge (at most the exact maximum).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sandgate.proxy.audit.format import clean
from sandgate.proxy.audit.query import Record

__all__ = ["GRANT_EVENT", "ApprovalStats", "approvals_document", "approvals_table"]

# The event of the record a grant writes (sandgate.proxy.approvals: scope `sandbox` or `tenant`).
GRANT_EVENT = "grant"
# How a held request's end record's reason names its outcome.
OUTCOMES = {
    "allowed": "approved",
    "approval_denied": "denied",
    "approval_timeout": "expired",
    "approval_required": "client_gone",
}
QUEUE_FULL = "approval_queue_full"
# Where a grant for the whole tenant (scope `tenant`, no sandbox) is counted.
TENANT_WIDE = "*"
_SMALLEST = 0.001  # seconds: bin 0 holds everything up to a millisecond
_RATIO = math.log(1.05)


@dataclass(slots=True)
class SandboxApprovals:
    """One sandbox's asks, their outcomes, their time held and the grants made for it."""

    asks: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    grants: int = 0
    held: int = 0
    longest: float = 0.0
    bins: Counter[int] = field(default_factory=Counter)

    def add_wait(self, seconds: float) -> None:
        self.held += 1
        self.longest = max(self.longest, seconds)
        self.bins[_bin(seconds)] += 1

    def percentile(self, p: float) -> float | None:
        """The time held at percentile `p` (0-100), to the bin's upper edge; None with no times."""
        if not self.held:
            return None
        rank = max(1, math.ceil(self.held * p / 100))
        seen = 0
        for index in sorted(self.bins):
            seen += self.bins[index]
            if seen >= rank:
                return min(_edge(index), self.longest)
        return self.longest


def _bin(seconds: float) -> int:
    return 0 if seconds <= _SMALLEST else math.ceil(math.log(seconds / _SMALLEST) / _RATIO)


def _edge(index: int) -> float:
    return _SMALLEST * math.exp(index * _RATIO)


class ApprovalStats:
    """Collects approval counts per (tenant, sandbox) from records of any event."""

    def __init__(self) -> None:
        self.sandboxes: dict[tuple[str, str], SandboxApprovals] = {}

    def add(self, record: Record) -> None:
        """Count one record (records about nothing approvals-related are passed over)."""
        event = record.get("event")
        if event == GRANT_EVENT:
            # Grants made (not revoked or expired); a tenant-wide one counts under sandbox `*`.
            if record.get("action", "made") == "made":
                self._of(record, TENANT_WIDE).grants += 1
            return
        if event != "decision":
            return
        if record.get("decision") == "ask":
            self._of(record).asks += 1
            return
        if record.get("reason") == QUEUE_FULL:
            entry = self._of(record)
            entry.asks += 1
            entry.outcomes["queue_full"] += 1
            return
        approval = record.get("approval")
        if not isinstance(approval, Mapping):
            return
        waited = approval.get("waited_seconds")
        if not isinstance(waited, int | float) or isinstance(waited, bool):
            # A request inside a tunnel an approval opened carries its approval, but was not held.
            return
        entry = self._of(record)
        entry.outcomes[OUTCOMES.get(str(record.get("reason")), "other")] += 1
        entry.add_wait(float(waited))

    def _of(self, record: Record, no_sandbox: str = "-") -> SandboxApprovals:
        tenant, sandbox = record.get("tenant"), record.get("sandbox")
        key = (
            str(tenant) if tenant is not None else "-",
            str(sandbox) if sandbox is not None else no_sandbox,
        )
        entry = self.sandboxes.get(key)
        if entry is None:
            entry = self.sandboxes[key] = SandboxApprovals()
        return entry


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def approvals_document(stats: ApprovalStats) -> list[dict[str, Any]]:
    """The per-sandbox entries of the stats document, by tenant then sandbox."""
    out = []
    for (tenant, sandbox), s in sorted(stats.sandboxes.items()):
        out.append(
            {
                "tenant": tenant,
                "sandbox": sandbox,
                "asks": s.asks,
                "outcomes": dict(sorted(s.outcomes.items())),
                "held_seconds": {
                    "count": s.held,
                    "p50": _rounded(s.percentile(50)),
                    "p99": _rounded(s.percentile(99)),
                    "max": _rounded(s.longest if s.held else None),
                },
                "grants": s.grants,
            }
        )
    return out


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}s"


def approvals_table(entries: list[dict[str, Any]]) -> list[str]:
    """The approvals part of `audit stats` as text lines (none when nothing was asked)."""
    if not entries:
        return []
    lines = ["", "approvals per sandbox:"]
    for e in entries:
        outcomes = ", ".join(f"{clean(k)} {v}" for k, v in e["outcomes"].items()) or "-"
        held = e["held_seconds"]
        lines.append(
            f"  {clean(e['tenant'])}/{clean(e['sandbox'])}: {e['asks']} asks ({outcomes}); "
            f"held p50 {_seconds(held['p50'])} p99 {_seconds(held['p99'])} max {_seconds(held['max'])}; "
            f"{e['grants']} grants"
        )
    return lines
