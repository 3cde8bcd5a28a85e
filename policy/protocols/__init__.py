"""Agent protocols at layer 7: readers and rules for MCP, JSON-RPC, GraphQL and SSE. Pure.

The gateway's addons feed bytes in and write answers out; reading and deciding live here,
so `decide()`, `policy test`, `explain` and `prove` see the message the gateway sees.

- `json_strict`: the one reading of a JSON body (duplicate keys, NaN, BOM, depth, size);
- `jsonrpc`: JSON-RPC 2.0 messages and batches; `mcp`: what an MCP message asks for;
- `arguments`: predicates on a tool call's arguments; `patterns`: time-bounded regexes and globs;
- `graphql_ops`: a GraphQL request's operations, root fields and cost (`graphql_model`: those
  values; `graphql_document`: the graphql-core parse behind them, loaded only by a policy with
  a `graphql:` section or the first GraphQL body);
- `sse`: an incremental, bounded server-sent events parser;
- `rules`: the `mcp:`, `jsonrpc:` and `graphql:` rule sections; `decide`: the verdicts;
- `answers`: refusals as JSON-RPC errors an agent can read;
- `list_filter`: list answers (`tools/list` ...) keeping only what a call would not be refused for.

Re-exported here: the errors and reason codes, which load only the standard library.
"""

from sandgate.policy.protocols.errors import (
    GraphqlError,
    JsonError,
    JsonRpcError,
    McpError,
    PatternError,
    Problem,
    ProtocolError,
    SseError,
)
from sandgate.policy.protocols.reasons import ProtocolReason

__all__ = [
    "GraphqlError",
    "JsonError",
    "JsonRpcError",
    "McpError",
    "PatternError",
    "Problem",
    "ProtocolError",
    "ProtocolReason",
    "SseError",
]
