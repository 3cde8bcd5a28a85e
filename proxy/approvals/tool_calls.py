"""MCP tool calls an `mcp.tools.ask` glob holds for a person: what the held access request shows
of each (its tool, its arguments' digest, a bounded preview of them), and the tool grants
that let one through without asking.

The preview is for the operator who decides, never for the audit trail (records carry the
digest only): the arguments' canonical JSON (sorted keys, ASCII escapes, so nothing in it can
steer a terminal), every string shaped like a sandgate placeholder masked, at most
PREVIEW_MAX characters, cut with a marker that says how long the whole was.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from sandgate.brokers.placeholders import MIN_SHAPE_CHARS, PLACEHOLDER_PREFIX
from sandgate.policy.model.grants import Grant, Grants, ToolCallAsked
from sandgate.policy.protocols.decide import BodyVerdict, MessageVerdict, Verdict
from sandgate.policy.protocols.json_strict import JsonValue
from sandgate.policy.protocols.mcp import McpBody
from sandgate.policy.protocols.reasons import ProtocolReason
from sandgate.policy.reasons import Reason

__all__ = [
    "PLACEHOLDER_MASK",
    "PREVIEW_MAX",
    "ToolCall",
    "arguments_preview",
    "asked_calls",
    "granted",
    "masked_placeholders",
    "refused_verdict",
    "released_verdict",
]

# The most of a preview an operator sees (characters; ASCII, so bytes too).
PREVIEW_MAX = 1024
PLACEHOLDER_MASK = "<placeholder>"
# As the broker matches them (sandgate.brokers.placeholders), in any case: the prefix and at
# least MIN_SHAPE_CHARS characters of its alphabet.
_PLACEHOLDER = re.compile(
    re.escape(PLACEHOLDER_PREFIX) + f"[a-z2-7]{{{MIN_SHAPE_CHARS},}}", re.IGNORECASE | re.ASCII
)

# The digest of a call's arguments (sandgate.proxy.addons.protocol_bodies.arguments_digest).
Digest = Callable[[JsonValue], str]


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One asked tool call as its held access request shows it."""

    tool: str
    arguments_sha256: str
    arguments_preview: str

    def view(self) -> dict[str, str]:
        return {
            "tool": self.tool,
            "arguments_sha256": self.arguments_sha256,
            "arguments_preview": self.arguments_preview,
        }


def arguments_preview(arguments: JsonValue, limit: int = PREVIEW_MAX) -> str:
    """The arguments for an operator to read (see the module docstring)."""
    text = json.dumps(
        masked_placeholders(arguments), sort_keys=True, separators=(",", ":"), ensure_ascii=True
    )
    if len(text) <= limit:
        return text
    marker = f"...[truncated: {len(text)} characters in all]"
    return text[: max(limit - len(marker), 0)] + marker


def masked_placeholders(value: JsonValue) -> Any:
    """The value with every placeholder-shaped run in its strings (keys too) masked."""
    if isinstance(value, str):
        return _PLACEHOLDER.sub(PLACEHOLDER_MASK, value)
    if isinstance(value, dict):
        return {_PLACEHOLDER.sub(PLACEHOLDER_MASK, k): masked_placeholders(v) for k, v in value.items()}
    if isinstance(value, list):
        return [masked_placeholders(v) for v in value]
    return value


def _asked(verdict: BodyVerdict, body: McpBody) -> Iterable[tuple[int, MessageVerdict]]:
    """The body's messages that were asked about: (their place, their verdict)."""
    for i, decided in enumerate(verdict.messages):
        if decided.verdict is Verdict.ASK and i < len(body.messages) and body.messages[i].tool is not None:
            yield i, decided


def asked_calls(verdict: BodyVerdict, body: McpBody, digest: Digest) -> tuple[ToolCall, ...]:
    """The tool calls of an `ask` body that wait for a person, in order."""
    calls = []
    for i, _ in _asked(verdict, body):
        message = body.messages[i]
        assert message.tool is not None
        arguments = message.arguments or {}
        calls.append(ToolCall(message.tool, digest(arguments), arguments_preview(arguments)))
    return tuple(calls)


@dataclass(frozen=True, slots=True)
class Where:
    """Who sent an asked body, and the request that carried it (what a tool grant must match)."""

    tenant: str
    sandbox: str
    host: str
    port: int
    method: str | None
    path: str | None


def granted(
    verdict: BodyVerdict,
    body: McpBody,
    where: Where,
    sources: Iterable[Grants],
    digest: Digest,
    now: float,
) -> tuple[Grant, ...] | None:
    """The live tool grants that allow every asked call of the body, one per call (in
    order), or None when any asked call has none (a request grant never counts). A counted
    grant (`max_uses`) is among them: the caller takes its uses (sandgate.proxy.addons.agent_protocols)."""
    found: list[Grant] = []
    books = tuple(sources)
    asked = list(_asked(verdict, body))
    if not asked:
        return None
    for i, _ in asked:
        message = body.messages[i]
        assert message.tool is not None
        arguments = message.arguments or {}
        call = ToolCallAsked(
            where.host, where.port, where.method, where.path, message.tool, arguments, digest(arguments)
        )
        grant = next(
            (g for book in books if (g := book.match_call(where.tenant, where.sandbox, call, now))), None
        )
        if grant is None:
            return None
        found.append(grant)
    return tuple(found)


def released_verdict(verdict: BodyVerdict, rules: Iterable[str | None] | None = None) -> BodyVerdict:
    """An `ask` body's verdict once released (approved, or allowed by grants): allowed, each
    asked call allowed under its rule (`rules`, one per asked call, in order; None: kept)."""
    names = list(rules) if rules is not None else None
    messages, k = [], 0
    for decided in verdict.messages:
        if decided.verdict is Verdict.ASK:
            rule = names[k] if names is not None and k < len(names) else decided.rule
            decided = replace(decided, verdict=Verdict.ALLOW, reason=Reason.ALLOWED, rule=rule)
            k += 1
        messages.append(decided)
    rule = names[0] if names else verdict.rule
    return replace(verdict, verdict=Verdict.ALLOW, reason=Reason.ALLOWED, rule=rule, messages=tuple(messages))


def refused_verdict(verdict: BodyVerdict, reason: Reason, detail: str) -> BodyVerdict:
    """An `ask` body's verdict once refused (denied, timed out, not holdable): each asked call
    refused for `reason`, every other member of its batch `batch_refused` (all or nothing)."""
    first = next((d.index for d in verdict.messages if d.verdict is Verdict.ASK), None)
    others = f"batch member {first} was refused ({reason})"
    messages = tuple(
        replace(d, verdict=Verdict.DENY, reason=reason, detail=detail)
        if d.verdict is Verdict.ASK
        else replace(d, verdict=Verdict.DENY, reason=ProtocolReason.BATCH_REFUSED, rule=None, detail=others)
        for d in verdict.messages
    )
    return replace(verdict, verdict=Verdict.DENY, reason=reason, detail=detail, messages=messages)
