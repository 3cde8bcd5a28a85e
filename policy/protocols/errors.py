"""Faults of the protocol readers: a message that cannot be read as its protocol.

A message that a rule needs and that cannot be read within its bounds is denied with
`invalid_request`; these exceptions carry why (`code`, one of `Problem`) for the audit
record and the JSON-RPC or GraphQL error the agent reads.

PolicyError (sandgate.policy.errors)
 └── ProtocolError          a message that is not valid for its protocol (`code`: a Problem)
      ├── JsonError          not strict, bounded JSON (duplicate key, NaN, BOM, too deep ...)
      ├── JsonRpcError       JSON, but not JSON-RPC 2.0 (bad version, colliding ids ...)
      ├── McpError           JSON-RPC, but not a readable MCP message (tool name, params shape)
      ├── GraphqlError       not one analysable GraphQL operation within the bounds
      └── SseError           a server-sent event stream over its bounds or not UTF-8
 └── PatternError           a rule's regex or glob refused at load (unbounded or surprising)
"""

from __future__ import annotations

from enum import StrEnum

from sandgate.policy.errors import PolicyError

__all__ = [
    "GraphqlError",
    "JsonError",
    "JsonRpcError",
    "McpError",
    "PatternError",
    "Problem",
    "ProtocolError",
    "SseError",
]


class Problem(StrEnum):
    """Why a message could not be read: the detail beside the reason `invalid_request`."""

    # JSON
    NOT_JSON = "not_json"
    INVALID_UTF8 = "invalid_utf8"
    BOM = "bom"
    DUPLICATE_KEY = "duplicate_key"
    NOT_FINITE = "not_finite"
    UNPAIRED_SURROGATE = "unpaired_surrogate"
    TOO_DEEP = "too_deep"
    TOO_LARGE = "too_large"
    # JSON-RPC
    NOT_JSONRPC = "not_jsonrpc"
    BAD_VERSION = "bad_version"
    BAD_METHOD = "bad_method"
    BAD_ID = "bad_id"
    BAD_PARAMS = "bad_params"
    DUPLICATE_ID = "duplicate_id"
    EMPTY_BATCH = "empty_batch"
    BATCH_TOO_LARGE = "batch_too_large"
    # MCP
    BAD_TOOL_NAME = "bad_tool_name"
    TOOL_NAME_NOT_CANONICAL = "tool_name_not_canonical"
    BAD_ARGUMENTS = "bad_arguments"
    # GraphQL
    GRAPHQL_SYNTAX = "graphql_syntax"
    TOO_MANY_TOKENS = "too_many_tokens"
    NO_OPERATION = "no_operation"
    AMBIGUOUS_OPERATION = "ambiguous_operation"
    UNKNOWN_FRAGMENT = "unknown_fragment"
    FRAGMENT_CYCLE = "fragment_cycle"
    TOO_COMPLEX = "too_complex"
    PERSISTED_HASH_MISMATCH = "persisted_hash_mismatch"
    # SSE
    LINE_TOO_LONG = "line_too_long"
    EVENT_TOO_LARGE = "event_too_large"


class ProtocolError(PolicyError, ValueError):
    """A message that is not valid for its protocol; `code` says why in one word."""

    def __init__(self, code: Problem, message: str) -> None:
        self.code = code
        # The id of the one message the problem is in, when it could be read: the refusal
        # is then answered for that id rather than for id null.
        self.rpc_id: str | int | None = None
        self.has_id = False
        super().__init__(f"{code}: {message}")


class JsonError(ProtocolError):
    """A body that is not strict JSON within the size and depth bounds."""


class JsonRpcError(ProtocolError):
    """A JSON value that is not a JSON-RPC 2.0 message or batch."""


class McpError(ProtocolError):
    """A JSON-RPC message that is not a readable MCP message."""


class GraphqlError(ProtocolError):
    """A GraphQL request that is not one analysable operation within the bounds."""


class SseError(ProtocolError):
    """A server-sent event stream over its bounds, or not UTF-8: the stream is refused."""


class PatternError(PolicyError, ValueError):
    """A rule's regex or glob refused at load: not bounded, or read otherwise than written."""
