"""The agent-protocol calls of a decision record: its `mcp` or `jsonrpc` object, read back.

A record of an exchange decided by an `mcp:` or `jsonrpc:` rule section carries one such
object (sandgate.proxy.addons.protocol_bodies.body_facts): the body's verdict, reason and
protocol rule, and per message its method, kind, id, tool (for `tools/call`) and its own
verdict, reason and rule, never an argument's value. In report mode the object's verdict is
`would_deny` while each message keeps `deny`: a message read here says `would_deny` then, so
counts show what enforcement would refuse. Anything malformed is skipped, never raised.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["PROTOCOLS", "Call", "calls", "glob_matches", "protocol_facts"]

# An audit record (sandgate.proxy.audit.query.Record, which imports this module).
type Record = Mapping[str, Any]

# The record keys of the protocols whose messages are JSON-RPC (GraphQL's has no methods).
PROTOCOLS = ("mcp", "jsonrpc")
_DENIED = frozenset({"deny", "would_deny"})


@dataclass(frozen=True, slots=True)
class Call:
    """One message of a protocol body, as its record tells it."""

    protocol: str  # `mcp` or `jsonrpc`
    method: str | None
    tool: str | None  # only for an MCP `tools/call`
    verdict: str  # allow, deny, would_deny, ask; `-` when the record does not say
    reason: str | None
    rule: str | None

    @property
    def denied(self) -> bool:
        """Whether this message was refused (or would be, in report mode)."""
        return self.verdict in _DENIED


def protocol_facts(record: Record) -> tuple[str, Mapping[str, Any]] | None:
    """The record's protocol key and object (`mcp` or `jsonrpc`), or None."""
    for key in PROTOCOLS:
        facts = record.get(key)
        if isinstance(facts, Mapping):
            return key, facts
    return None


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def calls(record: Record) -> Iterator[Call]:
    """Every message of the record's protocol body, in the order they were sent."""
    found = protocol_facts(record)
    if found is None:
        return
    protocol, facts = found
    messages = facts.get("messages")
    if not isinstance(messages, list):
        return
    report = facts.get("verdict") == "would_deny"
    for message in messages:
        if not isinstance(message, Mapping):
            continue
        verdict = _text(message.get("verdict")) or "-"
        if report and verdict == "deny":
            verdict = "would_deny"
        yield Call(
            protocol,
            _text(message.get("method")),
            _text(message.get("tool")),
            verdict,
            _text(message.get("reason")),
            _text(message.get("rule")),
        )


@functools.lru_cache(maxsize=256)
def _glob(pattern: str) -> re.Pattern[str]:
    """A glob as a regex: `*` any run of characters, `?` one, the rest literal, any case."""
    parts = ("." if c == "?" else ".*" if c == "*" else re.escape(c) for c in pattern)
    return re.compile("".join(parts), re.IGNORECASE | re.DOTALL)


def glob_matches(pattern: str, name: str) -> bool:
    """Whether `name` is matched by `pattern` (`*`, `?`), in any case, as policy deny globs are."""
    return _glob(pattern).fullmatch(name) is not None
