"""Counts of agent-protocol calls per tool or per method: `sandgate audit stats --by tool`.

Every message of an `mcp` or `jsonrpc` record counts once (a batch of three calls counts
three), by its own verdict: a call refused only because its batch was (`batch_refused`)
counts as denied with that reason, and report mode's refusals count as `would_deny`.
`--by tool` counts MCP `tools/call` messages by tool; `--by rpc-method` every MCP and
JSON-RPC message by method. Memory grows with distinct names and hosts, never with records.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sandgate.proxy.audit.calls import Call, calls
from sandgate.proxy.audit.format import clean
from sandgate.proxy.audit.query import Record, dest_host

__all__ = ["CallStats", "NameStats", "call_stats_document", "call_stats_table", "collect_calls"]

# `--by` → the document's list key and entry key.
_KEYS = {"tool": ("tools", "tool"), "rpc-method": ("methods", "method")}


@dataclass(slots=True)
class NameStats:
    """Counters of the calls of one tool (or method)."""

    calls: int = 0
    verdicts: Counter[str] = field(default_factory=Counter)
    denial_reasons: Counter[str] = field(default_factory=Counter)
    hosts: Counter[str] = field(default_factory=Counter)


@dataclass(slots=True)
class CallStats:
    """Counters per name over a run of records."""

    by: str
    records: int = 0
    names: dict[str, NameStats] = field(default_factory=dict)

    def name_of(self, call: Call) -> str | None:
        """The name this call is counted under, or None when it does not count."""
        return call.tool if self.by == "tool" else call.method

    def add(self, record: Record) -> None:
        """Count one record's calls."""
        self.records += 1
        host = dest_host(record) or "-"
        for call in calls(record):
            name = self.name_of(call)
            if name is None:
                continue
            entry = self.names.setdefault(name, NameStats())
            entry.calls += 1
            entry.verdicts[call.verdict] += 1
            entry.hosts[host] += 1
            if call.denied:
                entry.denial_reasons[call.reason or "-"] += 1


def collect_calls(records: Iterable[Record], by: str) -> CallStats:
    """The calls of `records`, counted per tool (`by="tool"`) or per method (`"rpc-method"`)."""
    stats = CallStats(by)
    for record in records:
        stats.add(record)
    return stats


def _ranked(counter: Counter[str], top: int | None = None) -> list[tuple[str, int]]:
    ranked = sorted(counter.items(), key=lambda kv: (-kv[1], kv[0]))
    return ranked if top is None else ranked[:top]


def call_stats_document(stats: CallStats, top: int) -> dict[str, Any]:
    """The counts as one JSON-ready document: the `top` most called names, most called first."""
    plural, key = _KEYS[stats.by]
    ranked = sorted(stats.names.items(), key=lambda kv: (-kv[1].calls, kv[0]))
    return {
        "records": stats.records,
        "by": stats.by,
        "calls": sum(s.calls for s in stats.names.values()),
        "distinct": len(stats.names),
        plural: [
            {
                key: name,
                "calls": s.calls,
                "verdicts": dict(_ranked(s.verdicts)),
                "denial_reasons": dict(_ranked(s.denial_reasons)),
                "top_hosts": [{"host": h, "count": c} for h, c in _ranked(s.hosts, top)],
            }
            for name, s in ranked[:top]
        ],
    }


def call_stats_table(document: dict[str, Any]) -> list[str]:
    """The document as text lines, one block per tool (or method)."""
    plural, key = _KEYS[document["by"]]
    what = "tool calls" if document["by"] == "tool" else "messages"
    shown = len(document[plural])
    distinct = document["distinct"]
    head = f"{document['records']} decision records, {document['calls']} {what}, {distinct} {plural}"
    lines = [head + (f" (the {shown} most called)" if shown < distinct else "")]
    for entry in document[plural]:
        lines += ["", f"{key} {clean(entry[key])}: {entry['calls']} {what}"]
        for label, counts in (("verdicts", entry["verdicts"]), ("denial reasons", entry["denial_reasons"])):
            text = ", ".join(f"{clean(k)} {v}" for k, v in counts.items())
            lines.append(f"  {label}: {text or '-'}")
        hosts = ", ".join(f"{clean(h['host'])} {h['count']}" for h in entry["top_hosts"])
        lines.append(f"  hosts: {hosts or '-'}")
    return lines
