"""Where the `params.arguments` of each MCP `tools/call` stand in the raw request body. No I/O.

A credential with `tools:` is replaced only inside the arguments of a call of a tool it names.
The gateway's strict reader (sandgate.policy.protocols) gives the calls and their tools but no
positions, and the broker replaces placeholders by byte span in the raw body. So the body is
walked here once more, with positions, and the walk is trusted only where it agrees with the
strict reading: the same number of messages, batch or not, and per message the same method
and tool. Anything else (a body that is not UTF-8 JSON, a compressed one, a key twice in a
message or its params, a disagreement) gives no spans, so no placeholder is replaced.

Spans are of the raw bytes: a placeholder found raw at [start, end) is inside a call's
arguments only when the arguments' value spans it. An escaped placeholder (`\\u0073gph_...`)
is not raw: the scan reports it as encoded and the planner refuses it, as for any body credential.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass

from sandgate.policy.protocols.mcp import TOOLS_CALL, McpBody

__all__ = ["ToolArguments", "tool_arguments"]

_WS = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()
# json's own string reader (not in its stubs): a key read the way its decoder reads one.
_scanstring: Callable[[str, int], tuple[str, int]] = json.decoder.scanstring  # type: ignore[attr-defined]


class _Disagree(Exception):
    """The walk cannot be trusted to mean what the strict reader read."""


@dataclass(frozen=True, slots=True)
class ToolArguments:
    """One `tools/call` of the body: its tool (as the strict reader read it), its message index
    in the body, and the byte span of its `params.arguments` value."""

    tool: str
    index: int
    start: int
    end: int

    def holds(self, start: int, end: int) -> bool:
        """Whether the raw bytes [start, end) lie inside these arguments."""
        return self.start <= start and end <= self.end


def tool_arguments(body: bytes, read: McpBody) -> tuple[ToolArguments, ...] | None:
    """The arguments spans of every `tools/call` in `body` (one with no arguments has none),
    or None when the raw body does not read as the strict reader's `read` (see the module)."""
    try:
        text = body.decode("utf-8")
        pos = _skip(text, 0)
        if read.batch != text.startswith("[", pos):
            return None
        messages, end = _array(text, pos) if read.batch else _one(text, pos)
        if _skip(text, end) != len(text) or len(messages) != len(read.messages):
            return None
        out: list[ToolArguments] = []
        for index, (walked, message) in enumerate(zip(messages, read.messages, strict=True)):
            method, tool, span = walked
            if method != message.method or (method == TOOLS_CALL and tool != message.tool):
                return None
            if method == TOOLS_CALL and span is not None and message.tool is not None:
                out.append(
                    ToolArguments(message.tool, index, _bytes_at(text, span[0]), _bytes_at(text, span[1]))
                )
        return tuple(out)
    except (_Disagree, ValueError, RecursionError):
        return None


type _Walked = tuple[object, object, tuple[int, int] | None]


def _skip(text: str, pos: int) -> int:
    match = _WS.match(text, pos)
    assert match is not None  # `*` always matches
    return match.end()


def _one(text: str, pos: int) -> tuple[list[_Walked], int]:
    walked, end = _message(text, pos)
    return [walked], end


def _array(text: str, pos: int) -> tuple[list[_Walked], int]:
    """The messages of a batch: `[` message (`,` message)* `]`."""
    out: list[_Walked] = []
    pos = _skip(text, pos + 1)
    if text.startswith("]", pos):
        return out, pos + 1
    while True:
        walked, pos = _message(text, pos)
        out.append(walked)
        pos = _skip(text, pos)
        if text.startswith("]", pos):
            return out, pos + 1
        if not text.startswith(",", pos):
            raise _Disagree
        pos = _skip(text, pos + 1)


def _message(text: str, pos: int) -> tuple[_Walked, int]:
    """One message's method, its tool name and its arguments' span (chars), and where it ends."""
    members, end = _members(text, pos)
    method = members["method"][2] if "method" in members else None
    tool: object = None
    span: tuple[int, int] | None = None
    if method == TOOLS_CALL and "params" in members:
        start = members["params"][0]
        if text.startswith("{", start):
            params, _ = _members(text, start)
            tool = params["name"][2] if "name" in params else None
            if "arguments" in params:
                span = params["arguments"][0], params["arguments"][1]
    return (method, tool, span), end


def _members(text: str, pos: int) -> tuple[dict[str, tuple[int, int, object]], int]:
    """An object's members: key → (value start, value end, value), and where it ends; a key
    twice (the strict reader refuses that too) or anything but an object raises."""
    if not text.startswith("{", pos):
        raise _Disagree
    members: dict[str, tuple[int, int, object]] = {}
    pos = _skip(text, pos + 1)
    if text.startswith("}", pos):
        return members, pos + 1
    while True:
        if not text.startswith('"', pos):
            raise _Disagree
        key, pos = _scanstring(text, pos + 1)
        pos = _skip(text, pos)
        if not text.startswith(":", pos) or key in members:
            raise _Disagree
        start = _skip(text, pos + 1)
        value, end = _DECODER.raw_decode(text, start)
        members[key] = (start, end, value)
        pos = _skip(text, end)
        if text.startswith("}", pos):
            return members, pos + 1
        if not text.startswith(",", pos):
            raise _Disagree
        pos = _skip(text, pos + 1)


def _bytes_at(text: str, index: int) -> int:
    """The byte offset in the UTF-8 body of character `index`."""
    return len(text[:index].encode("utf-8"))
