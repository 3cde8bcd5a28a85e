"""What an MCP message asks for: method, tool and arguments, resource URI, prompt. No I/O.

MCP messages are JSON-RPC 2.0 (sandgate.policy.protocols.jsonrpc) with MCP's own rules on
top, which are enforced here: a request id is never null, `params` is always an object
(`params` as an array is refused for every MCP method, `tools/call` included), a
`tools/call` names its tool in `params.name` and passes `params.arguments` as an object or
not at all, `resources/read` (and subscribe) gives `params.uri`, `prompts/get` `params.name`.

Tool names. MCP tool names are case-sensitive: `Delete_Repo` and `delete_repo` are two
tools to the server. A name is read only when it is already in the one form no reader can
take for another: 1 to 128 characters of `A-Z a-z 0-9 _ . : / -`. Everything else is
refused (`invalid_request`), never matched: NUL and control characters, leading or
trailing whitespace, and any non-ASCII character, so that a confusable (Cyrillic `а` in
`delete_repo`) or a full-width name (which NFKC folds to ASCII, and a server may or may not)
is never matched against a rule written in ASCII. NFKC only serves the error message
("reads as 'delete_repo'"). Case is handled by the rules: deny globs match in any case,
allow globs only in the case written (sandgate.policy.protocols.rules).
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import NoReturn

from sandgate.policy.protocols.errors import McpError, Problem
from sandgate.policy.protocols.json_strict import DEFAULT_LIMITS, JsonLimits, JsonValue
from sandgate.policy.protocols.jsonrpc import DEFAULT_MAX_BATCH, Kind, RpcBody, RpcMessage, parse_jsonrpc

__all__ = [
    "INITIALIZE",
    "PROMPTS_GET",
    "RESOURCES_READ",
    "RESOURCE_METHODS",
    "TOOLS_CALL",
    "TOOLS_LIST",
    "TOOL_NAME",
    "McpBody",
    "McpMessage",
    "canonical_tool_name",
    "parse_mcp",
    "read_mcp",
]

INITIALIZE = "initialize"
TOOLS_CALL = "tools/call"
TOOLS_LIST = "tools/list"
RESOURCES_READ = "resources/read"
PROMPTS_GET = "prompts/get"
# Methods whose subject is one resource URI.
RESOURCE_METHODS = frozenset({RESOURCES_READ, "resources/subscribe", "resources/unsubscribe"})

TOOL_NAME = re.compile(r"[A-Za-z0-9_.:/-]{1,128}", re.ASCII)
_MAX_URI = 2048
# A URI that servers could resolve to another: dot segments, encoded dots, slashes and
# backslashes, a raw backslash, whitespace and controls.
_AMBIGUOUS_URI = re.compile(r"(?:^|/)\.{1,2}(?:/|$|[?#])|%2[eEfF]|%5[cC]|\\|[\s\x00-\x1f\x7f]")


@dataclass(frozen=True, slots=True)
class McpMessage:
    """One MCP message and what it asks for. `tool` and `arguments` for `tools/call`
    (arguments `{}` when absent), `uri` for a resource method, `prompt` for `prompts/get`."""

    rpc: RpcMessage
    tool: str | None = None
    arguments: dict[str, JsonValue] | None = None
    uri: str | None = None
    prompt: str | None = None

    @property
    def method(self) -> str | None:
        return self.rpc.method

    @property
    def index(self) -> int | None:
        return self.rpc.index


@dataclass(frozen=True, slots=True)
class McpBody:
    """The MCP messages of one body, in order; `batch` when the body was an array."""

    messages: tuple[McpMessage, ...]
    batch: bool


def parse_mcp(
    data: bytes | str, limits: JsonLimits = DEFAULT_LIMITS, *, max_batch: int = DEFAULT_MAX_BATCH
) -> McpBody:
    """Strict JSON, JSON-RPC, then MCP: what a body asks for (or a ProtocolError)."""
    return read_mcp(parse_jsonrpc(data, limits, max_batch=max_batch))


def read_mcp(body: RpcBody) -> McpBody:
    """The MCP reading of JSON-RPC messages, or McpError for the first unreadable one (with
    the message's id when the body is that one message)."""
    if body.batch:
        return McpBody(tuple(read_mcp_message(m) for m in body.messages), batch=True)
    message = body.messages[0]
    try:
        return McpBody((read_mcp_message(message),), batch=False)
    except McpError as e:
        if message.kind is Kind.REQUEST and message.id is not None:
            e.rpc_id, e.has_id = message.id, True
        raise


def read_mcp_message(message: RpcMessage) -> McpMessage:
    """One JSON-RPC message as MCP: refuse what MCP does not allow, read the subject."""
    if message.kind is Kind.RESPONSE:
        return McpMessage(message)
    if message.kind is Kind.REQUEST and message.id is None:
        _fail(Problem.BAD_ID, f"{_where(message)}: an MCP request id is never null")
    params = message.params
    if isinstance(params, list):
        _fail(Problem.BAD_PARAMS, f"{_where(message)}: MCP 'params' is an object, not an array")
    params = params or {}
    if message.method == TOOLS_CALL:
        return McpMessage(message, tool=canonical_tool_name(params.get("name")), arguments=_arguments(params))
    if message.method in RESOURCE_METHODS:
        return McpMessage(message, uri=_uri(params.get("uri"), message))
    if message.method == PROMPTS_GET:
        return McpMessage(message, prompt=canonical_tool_name(params.get("name"), what="prompt name"))
    return McpMessage(message)


def canonical_tool_name(value: JsonValue, *, what: str = "tool name") -> str:
    """The name itself when it is canonical (see the module docstring), else McpError."""
    if not isinstance(value, str):
        _fail(Problem.BAD_TOOL_NAME, f"the {what} is not a string")
    if TOOL_NAME.fullmatch(value):
        return value
    normal = unicodedata.normalize("NFKC", value)
    if normal != value and TOOL_NAME.fullmatch(normal):
        _fail(Problem.TOOL_NAME_NOT_CANONICAL, f"the {what} {_echo(value)} reads as {normal!r} after NFKC")
    _fail(Problem.BAD_TOOL_NAME, f"the {what} {_echo(value)} {_name_problem(value)}")


def _name_problem(value: str) -> str:
    """Why a name is not in the tool-name charset, in words."""
    if not value:
        return "is empty"
    if len(value) > 128:
        return "is longer than 128 characters"
    if value != value.strip():
        return "has leading or trailing whitespace"
    for ch in value:
        if ord(ch) < 0x20 or 0x7F <= ord(ch) < 0xA0:
            return f"has a control character U+{ord(ch):04X}"
        if not ch.isascii():
            return f"has a non-ASCII character U+{ord(ch):04X} ({unicodedata.name(ch, 'unnamed')})"
    return "has a character outside A-Z a-z 0-9 _ . : / -"


def _arguments(params: dict[str, JsonValue]) -> dict[str, JsonValue]:
    """`params.arguments`: an object, or {} when absent."""
    if "arguments" not in params:
        return {}
    arguments = params["arguments"]
    if not isinstance(arguments, dict):
        _fail(Problem.BAD_ARGUMENTS, "tools/call 'arguments' is not an object")
    return arguments


def _uri(value: JsonValue, message: RpcMessage) -> str:
    """A resource URI that no server reads as another one."""
    if not isinstance(value, str) or not value or len(value) > _MAX_URI:
        _fail(Problem.BAD_PARAMS, f"{_where(message)}: 'uri' is not a string of 1 to {_MAX_URI} characters")
    if _AMBIGUOUS_URI.search(value):
        _fail(
            Problem.BAD_PARAMS,
            f"{_where(message)}: the uri {_echo(value)} is ambiguous (dot segments, escapes)",
        )
    return value


def _where(message: RpcMessage) -> str:
    return "the message" if message.index is None else f"batch member {message.index}"


def _echo(text: str) -> str:
    """Repr of at most 40 characters of a guest-supplied value."""
    return repr(text[:40]) + ("..." if len(text) > 40 else "")


def _fail(code: Problem, message: str) -> NoReturn:
    raise McpError(code, message)
