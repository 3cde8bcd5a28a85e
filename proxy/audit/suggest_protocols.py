"""Lines for the `mcp:` and `jsonrpc:` sections of existing allow rules, from refused calls.

A tool call or method refused inside a rule that allows its host (tool_not_allowed,
tool_denied, argument_not_allowed, rpc_method_not_allowed; `deny` and report mode's
`would_deny`) is no missing rule: the host's rule is there, its section said no. So these
suggestions are lines to merge into that rule's section, grouped by the rule (the record's
`rule_id`), host and protocol, printed as comments: with the leading `# ` removed, a rule's
block is YAML (its notes are YAML comments), while the whole output stays one document whose
only key is the `allow:` list of new rules.

- tool_not_allowed: the tool joins `mcp.tools.allow`.
- rpc_method_not_allowed with no protocol rule (no allow glob matched): the method joins
  `methods.allow`; for MCP the list keeps MCP's default methods, which a list replaces.
- tool_denied, or a method a deny glob refused: nothing to add (a deny glob wins over any
  allow); the note names the glob's place (`mcp.tools.deny[0]`) to narrow by hand.
- argument_not_allowed: the note names the predicate that failed; a predicate is written by
  hand, since the trail holds no argument value (only its digest) and none is guessed.

Names are only those of refused calls, each checked by the policy's own section model.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import yaml
from pydantic import ValidationError

from sandgate.policy.protocols.rules import DEFAULT_MCP_METHODS, McpSection, MethodRules
from sandgate.policy.reasons import Reason
from sandgate.proxy.audit.calls import Call, calls
from sandgate.proxy.audit.format import clean
from sandgate.proxy.audit.query import Record, record_time
from sandgate.proxy.audit.suggest_operator import time_span

__all__ = ["PROTOCOL_SUGGESTIBLE", "ProtocolEvidence", "RuleCalls"]

PROTOCOL_SUGGESTIBLE = frozenset(
    {
        Reason.TOOL_NOT_ALLOWED,
        Reason.TOOL_DENIED,
        Reason.ARGUMENT_NOT_ALLOWED,
        Reason.RPC_METHOD_NOT_ALLOWED,
    }
)

# A refused name: (what, name, reason, the protocol rule that refused it or "").
type Refusal = tuple[str, str, str, str]


@dataclass(slots=True)
class RuleCalls:
    """The refused calls of one protocol under one allow rule and host."""

    protocol: str
    rule_id: str | None
    host: str
    count: int = 0
    refused: Counter[Refusal] = field(default_factory=Counter)
    first: datetime | None = None
    last: datetime | None = None

    def add(self, call: Call, moment: datetime | None) -> None:
        """Count one refused call."""
        if call.reason == Reason.RPC_METHOD_NOT_ALLOWED:
            what, name = "method", call.method
        else:
            what, name = "tool", call.tool
        if name is None:
            return
        self.count += 1
        self.refused[(what, name, str(call.reason), call.rule or "")] += 1
        if moment is not None:
            self.first = moment if self.first is None else min(self.first, moment)
            self.last = moment if self.last is None else max(self.last, moment)


@dataclass(slots=True)
class ProtocolEvidence:
    """Refused protocol calls, per (protocol, rule, host)."""

    groups: dict[tuple[str, str | None, str], RuleCalls] = field(default_factory=dict)

    def add(self, record: Record, host: str) -> bool:
        """Take the record's refused calls with a suggestible reason; whether there were any."""
        rule_id = record.get("rule_id")
        rule = rule_id if isinstance(rule_id, str) else None
        taken = False
        for call in calls(record):
            if not call.denied or call.reason not in PROTOCOL_SUGGESTIBLE:
                continue
            key = (call.protocol, rule, host)
            self.groups.setdefault(key, RuleCalls(*key)).add(call, record_time(record))
            taken = True
        return taken

    def lines(self, tenant: str | None, min_count: int) -> list[str]:
        """The section lines per rule, as comments (empty when nothing was refused)."""
        if not self.groups:
            return []
        where = f"tenant {clean(tenant)}'s file" if tenant else "the tenant's file"
        out = [
            "# Calls refused inside rules that allow their host: merge the lines under each rule into",
            f"# its mcp: or jsonrpc: section in {where} (remove the leading `# `), then run",
            "# `sandgate policy check`. Names come from refused calls only; no argument value is",
            "# in the trail or used here.",
        ]
        for group in sorted(self.groups.values(), key=lambda g: (-g.count, g.rule_id or "", g.host)):
            out += _group_lines(group, min_count)
        return out


def _reasons(group: RuleCalls) -> str:
    counts: Counter[str] = Counter()
    for (_, _, reason, _), n in group.refused.items():
        counts[reason] += n
    return ", ".join(f"{r} {n}" for r, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _why_not(what: str, reason: str, rule: str) -> str:
    """Why a refused name gets no line, and what to do by hand."""
    if reason == Reason.ARGUMENT_NOT_ALLOWED:
        return (
            f"failed {rule or 'an argument predicate'}: write that predicate by hand "
            "(the trail has no argument values to suggest one from)"
        )
    return f"refused by deny glob {rule or '(unknown)'}, which wins over any allow: narrow it by hand"


def _valid(what: str, name: str) -> bool:
    """Whether a policy section could name it (the section models' own checks)."""
    try:
        if what == "tool":
            McpSection.model_validate({"tools": {"allow": [name]}})
        else:
            MethodRules.model_validate({"allow": [name]})
    except ValidationError:
        return False
    return True


def _section(protocol: str, tools: list[str], methods: list[str]) -> dict[str, Any]:
    """The section lines to merge: tools to allow, methods to allow."""
    section: dict[str, Any] = {}
    if tools:
        section["tools"] = {"allow": tools}
    if methods:
        defaults = list(DEFAULT_MCP_METHODS) if protocol == "mcp" else []
        section["methods"] = {"allow": [*defaults, *methods]}
    return {protocol: section}


def _group_lines(group: RuleCalls, min_count: int) -> list[str]:
    """One rule's header, its section lines and its notes, as comments."""
    per_name: Counter[tuple[str, str]] = Counter()
    for (what, name, _, _), n in group.refused.items():
        per_name[(what, name)] += n
    add: dict[str, list[str]] = {"tool": [], "method": []}
    notes: list[str] = []
    for (what, name, reason, rule), n in sorted(group.refused.items()):
        calls_text = _plural(n, "call")
        if reason in (Reason.TOOL_NOT_ALLOWED, Reason.RPC_METHOD_NOT_ALLOWED) and not rule:
            if per_name[(what, name)] < min_count:
                notes.append(f"{clean(name)} ({what}, {calls_text}): fewer than --min-count {min_count}")
            elif not _valid(what, name):
                notes.append(f"{clean(name)} ({what}, {calls_text}): not a name a rule can hold")
            elif name not in add[what]:
                add[what].append(name)
        else:
            notes.append(f"{clean(name)} ({what}, {calls_text}): {_why_not(what, reason, clean(rule))}")
    rule = clean(group.rule_id) if group.rule_id else "(the rule that allows it)"
    out = [
        "#",
        f"# rule {rule}, host {clean(group.host)} ({group.protocol}): "
        f"{_plural(group.count, 'refused call')} ({_reasons(group)}), {time_span(group.first, group.last)}",
    ]
    if add["tool"] or add["method"]:
        section = _section(group.protocol, add["tool"], add["method"])
        text = yaml.safe_dump(section, sort_keys=False, default_flow_style=None, width=96)
        out += [f"# {line}" for line in text.rstrip("\n").splitlines()]
        if add["method"] and group.protocol == "mcp":
            only = ", ".join(map(clean, add["method"]))
            out.append("# # MCP's default methods (a list replaces them) plus the refused ones;")
            out.append(f"# # if the rule lists its own methods, add only: {only}")
    if notes:
        # YAML comments once the `# ` is removed: the block pastes whole.
        out.append("# # not suggested:")
        out += [f"# #   {note}" for note in notes]
    return out
