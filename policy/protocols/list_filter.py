"""MCP list answers filtered: an agent sees only the tools, resources and prompts it may use. Pure.

A `tools/list`, `resources/list` or `prompts/list` call allowed under an `mcp:` section is
remembered by its id (`ListCalls`). The answer to it (a JSON-RPC response, alone, in a batch,
or as the `data` of a server-sent event) keeps in its `result` only the entries a call would
not be refused for, decided by the same path as that call (decide_mcp_message on the
`tools/call`, `resources/read` or `prompts/get` it would be):

- tools: removed when `tools/call` is not an allowed method, the name is not canonical
  (a call naming it would be `invalid_request`), a deny glob matches (any case), or neither
  an allow nor an ask glob does; `ask` tools stay (an approval can let them through), and so
  do tools with `arguments` predicates (some arguments pass);
- resources by `uri`, prompts by `name`: removed when the call on them would be refused;
- an entry that is not an object, or lacks its name or URI, is removed.

Responses to other ids, errors, notifications and requests pass as they are.
`notifications/tools/list_changed` needs nothing here: the agent lists again and the new
answer is filtered like the first. `resources/templates/list` is not filtered (a URI template
is not a URI a glob can be decided on; `resources/read` on what it expands to still is).

An answer that cannot be read strictly (sandgate.policy.protocols.json_strict, jsonrpc) is a
ProtocolError: the gateway then withholds it, never passes it unfiltered. `SseListFilter`
does the same for an event stream, incrementally and within bounds (events it does not
rewrite go out byte for byte).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import cast

from sandgate.policy.protocols.decide import Verdict, decide_mcp_message
from sandgate.policy.protocols.errors import McpError, Problem, ProtocolError, SseError
from sandgate.policy.protocols.json_strict import DEFAULT_LIMITS, JsonLimits, JsonValue, loads_strict
from sandgate.policy.protocols.jsonrpc import Kind, RpcMessage, read_jsonrpc
from sandgate.policy.protocols.mcp import (
    PROMPTS_GET,
    RESOURCES_READ,
    TOOLS_CALL,
    TOOLS_LIST,
    McpBody,
    read_mcp_message,
)
from sandgate.policy.protocols.reasons import ProtocolReason
from sandgate.policy.protocols.rules import McpSection
from sandgate.policy.protocols.sse import SseParser

__all__ = [
    "LIST_METHODS",
    "Filtered",
    "ListCalls",
    "SseListFilter",
    "filter_list_body",
    "filter_list_message",
    "list_calls",
    "visible",
]

RESOURCES_LIST = "resources/list"
PROMPTS_LIST = "prompts/list"
# A list method → (the result's key, the entry's field that names it, the call it would be).
LIST_METHODS: Mapping[str, tuple[str, str, str]] = {
    TOOLS_LIST: ("tools", "name", TOOLS_CALL),
    RESOURCES_LIST: ("resources", "uri", RESOURCES_READ),
    PROMPTS_LIST: ("prompts", "name", PROMPTS_GET),
}

type RpcId = str | int | None


def _key(rpc_id: RpcId) -> str | None:
    """An id as JSON-RPC batches compare them (1 and "1" alike: fail closed)."""
    return None if rpc_id is None else str(rpc_id)


@dataclass(frozen=True, slots=True)
class ListCalls:
    """The list calls of one allowed request, by id, and the section their answers obey.

    `by_shape`: the calls were made elsewhere (a GET event stream carries answers to POSTs of
    the older HTTP+SSE transport, or events replayed after `Last-Event-ID`): every response
    whose result has exactly a list's shape is filtered as that list's answer."""

    section: McpSection
    calls: tuple[tuple[RpcId, str], ...]
    by_shape: bool = False

    def method_of(self, rpc_id: RpcId) -> str | None:
        """The list method called with this id, or None."""
        key = _key(rpc_id)
        return next((m for i, m in self.calls if _key(i) == key), None)

    def method_for(self, rpc: RpcMessage, member: Mapping[str, JsonValue]) -> str | None:
        """The list method a response answers, by its id or (`by_shape`) by its result."""
        if rpc.kind is not Kind.RESPONSE:
            return None
        if not self.by_shape:
            return self.method_of(rpc.id)
        result = member.get("result")
        if not isinstance(result, dict):
            return None
        # Only a result that is nothing but a list (and its paging) is read as one: a tool's
        # own result that happens to hold a `tools` key is left alone.
        keys = set(result) - _LIST_PAGING
        return next((m for m, (key, _, _) in LIST_METHODS.items() if keys == {key}), None)


_LIST_PAGING = frozenset({"nextCursor", "_meta"})


def list_calls(section: McpSection, body: McpBody) -> ListCalls | None:
    """The list calls among a body's requests, or None when it has none."""
    calls = tuple(
        (m.rpc.id, m.rpc.method)
        for m in body.messages
        if m.rpc.kind is Kind.REQUEST and m.rpc.method in LIST_METHODS
    )
    return ListCalls(section, cast(tuple[tuple[RpcId, str], ...], calls)) if calls else None


def visible(section: McpSection, method: str, entry: JsonValue) -> tuple[bool, str]:
    """Whether one entry of a `method` answer may be shown, and its name (for the record)."""
    _, name_field, call = LIST_METHODS[method]
    name = entry.get(name_field) if isinstance(entry, dict) else None
    if not isinstance(name, str):
        return False, "?"
    param = "uri" if call == RESOURCES_READ else "name"
    request = RpcMessage(Kind.REQUEST, id=0, has_id=True, method=call, params={param: name})
    try:
        message = read_mcp_message(request)
    except McpError:
        return False, name[:128]  # not canonical: a call naming it would be refused
    verdict = decide_mcp_message(message, section)
    # The arguments here are none at all: a predicate failing on them says nothing of a real call.
    kept = verdict.verdict is not Verdict.DENY or verdict.reason is ProtocolReason.ARGUMENT_NOT_ALLOWED
    return kept, name[:128]


def filter_list_message(
    section: McpSection, method: str, message: dict[str, JsonValue]
) -> tuple[dict[str, JsonValue], tuple[str, ...]]:
    """The response `message` to a `method` call with the entries `section` refuses removed,
    and their names; the message itself when nothing is removed (McpError: a list that is
    not a list)."""
    result = message.get("result")
    key = LIST_METHODS[method][0]
    if not isinstance(result, dict) or key not in result:
        return message, ()
    entries = result[key]
    if not isinstance(entries, list):
        raise McpError(Problem.NOT_JSONRPC, f"{method}: result.{key} is not an array")
    kept: list[JsonValue] = []
    removed: list[str] = []
    for entry in entries:
        shown, name = visible(section, method, entry)
        if shown:
            kept.append(entry)
        else:
            removed.append(name)
    if not removed:
        return message, ()
    return {**message, "result": {**result, key: kept}}, tuple(removed)


@dataclass(frozen=True, slots=True)
class Filtered:
    """A filtered answer: its new bytes (None: unchanged) and what was removed, as (method, name)."""

    data: bytes | None
    removed: tuple[tuple[str, str], ...] = ()


def filter_list_body(calls: ListCalls, data: bytes | str, limits: JsonLimits = DEFAULT_LIMITS) -> Filtered:
    """A JSON-RPC answer (one message or a batch) with each list result filtered; a
    ProtocolError when it cannot be read strictly."""
    value = loads_strict(data, limits)
    body = read_jsonrpc(value)
    members = cast(list[dict[str, JsonValue]], value if isinstance(value, list) else [value])
    out: list[JsonValue] = []
    removed: list[tuple[str, str]] = []
    for member, rpc in zip(members, body.messages, strict=True):
        method = calls.method_for(rpc, member)
        if method is not None:
            member, names = filter_list_message(calls.section, method, member)
            removed += [(method, n) for n in names]
        out.append(member)
    if not removed:
        return Filtered(None)
    new: JsonValue = out if body.batch else out[0]
    text = json.dumps(new, ensure_ascii=False, separators=(",", ":"))
    return Filtered(text.encode("utf-8"), tuple(removed))


_EOL = re.compile(rb"\r\n|\r|\n")
_BOM = b"\xef\xbb\xbf"


def _is_data(line: bytes) -> bool:
    """Whether a raw line (its end included) is a `data` field."""
    bare = line.removeprefix(_BOM).rstrip(b"\r\n")
    return bare == b"data" or bare.startswith(b"data:")


@dataclass(slots=True)
class SseListFilter:
    """An event stream with list results filtered: `feed` bytes in, take bytes to send out;
    `close` at its end. Each event's `data` is read as JSON-RPC; an event holding an answer
    to a list call is sent again with its data rewritten (its other lines kept), any other
    event byte for byte. Memory: one line and one event (`max_event` characters of data, at
    most twice that in raw lines); over it, or an event whose data is not strict JSON-RPC, a
    ProtocolError, and everything after is refused too. An event the stream leaves unfinished
    is dropped, as a client would drop it."""

    calls: ListCalls
    max_event: int = DEFAULT_LIMITS.max_bytes
    limits: JsonLimits = DEFAULT_LIMITS
    removed: list[tuple[str, str]] = field(default_factory=list)
    _parser: SseParser | None = None
    _buffer: bytearray = field(default_factory=bytearray)
    _held: list[bytes] = field(default_factory=list)
    _held_size: int = 0
    _failed: ProtocolError | None = None

    def feed(self, chunk: bytes) -> bytes:
        """The bytes this chunk lets go (complete events, and lines before an event's data)."""
        if self._failed is not None:
            raise self._failed
        try:
            self._buffer += chunk
            out = bytearray()
            pos = 0
            for m in _EOL.finditer(self._buffer):
                if m[0] == b"\r" and m.end() == len(self._buffer):
                    break  # perhaps the CR of a CRLF cut between chunks: wait for the next byte
                out += self._line(bytes(self._buffer[pos : m.end()]))
                pos = m.end()
            del self._buffer[:pos]
            if len(self._buffer) > self.max_event:
                raise SseError(Problem.LINE_TOO_LONG, f"a line over {self.max_event} bytes")
            return bytes(out)
        except ProtocolError as e:
            self._failed = e
            raise

    def close(self) -> bytes:
        """The end of the stream: what a last line ends; an unfinished event is dropped."""
        out = self.feed(b"")
        if self._buffer and self._buffer.endswith(b"\r"):
            out += self._line(bytes(self._buffer))
        self._buffer.clear()
        self._held, self._held_size = [], 0
        if self._parser is not None:
            self._parser.close()
        return out

    def _line(self, line: bytes) -> bytes:
        """One complete raw line: held while its event has data, else passed on."""
        if self._parser is None:
            self._parser = SseParser(max_line=self.max_event, max_event=self.max_event)
        events = self._parser.feed(line)
        if not self._held and not _is_data(line) and not events:
            return line  # a comment, `event:`, `id:` or blank line before any data: nothing to decide
        self._held.append(line)
        self._held_size += len(line)
        if self._held_size > 2 * self.max_event:
            raise SseError(Problem.EVENT_TOO_LARGE, f"an event over {2 * self.max_event} bytes")
        if not events:
            return b""
        held, self._held, self._held_size = self._held, [], 0
        if self.calls.by_shape and events[0].event != "message":
            return b"".join(held)  # the older transport's `endpoint` event: a URL, no JSON-RPC
        data = self._rewritten(events[0].data)
        if data is None:
            return b"".join(held)
        out = bytearray()
        first = True
        for raw in held:
            if not _is_data(raw):
                out += raw
            elif first:
                first = False
                end = raw[len(raw.rstrip(b"\r\n")) :]
                out += b"data: " + data + end
        return bytes(out)

    def _rewritten(self, data: str) -> bytes | None:
        """The event's data filtered, or None to send it as it came."""
        if not data.strip():
            return None  # a priming event (an id, empty data): no message
        filtered = filter_list_body(self.calls, data, self.limits)
        self.removed += filtered.removed
        return filtered.data
