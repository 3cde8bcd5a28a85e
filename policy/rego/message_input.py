"""Rego's `input.mcp`, `input.jsonrpc` and `input.graphql`: one object per message of a body an
agent-protocol rule read and allowed. Pure.

Built from what the rule's reader read (sandgate.policy.protocols: the same parsed messages
the YAML section decided, so Rego and the YAML never see two readings of one body):

    mcp      {kind, method, tool, arguments, uri, prompt, id, batch_index, batch_size, session}
    jsonrpc  {kind, method, params, id, batch_index, batch_size}
    graphql  {operation_type, operation_name, root_fields, selected, variables,
              persisted_sha256, introspection, batch_index, batch_size}: one per operation of
              each request (every operation must pass, as in the YAML), one with null
              operation fields for a persisted query sent by its hash alone

`kind` is request, notification or response (a response to the server's own request asks for
nothing, and is asked about all the same). `batch_index` is the place in a batch (null when
the body is one message or one request), `batch_size` the count (1 then).

Secrets. Argument, params and variables values are passed as sent: a policy must read them to
decide on them, and they hold at most placeholders (real credentials are injected after
every decision). The values of keys whose name looks secret (the header and query rule,
sandgate.policy.rego.input_document.is_secret_name) are REDACTED at any depth, as headers
are. `session` is the sha256 (hex) of the `Mcp-Session-Id` header: a session id lets anyone
holding it speak in that session, and header names with "session" are redacted, so a policy
gets a stable handle to compare (`crypto.sha256(id)`), never the value. None of this is
written to the audit record (which keeps `arguments_sha256` only).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sandgate.policy.protocols.graphql_ops import GraphqlOperation, GraphqlRequest
from sandgate.policy.protocols.json_strict import JsonValue
from sandgate.policy.protocols.jsonrpc import RpcBody, RpcMessage
from sandgate.policy.protocols.mcp import McpBody, McpMessage
from sandgate.policy.rego.input_document import REDACTED, MessageField, is_secret_name

__all__ = [
    "MessageInput",
    "graphql_inputs",
    "graphql_variables",
    "jsonrpc_inputs",
    "mcp_inputs",
    "redacted",
    "session_digest",
]


@dataclass(frozen=True, slots=True)
class MessageInput:
    """One evaluation's protocol field, and the member of the body it is about: `index` is a
    JSON-RPC batch index (None for a body of one message) or a GraphQL request's place."""

    field: MessageField
    index: int | None
    id: str | int | None = None
    has_id: bool = False
    # What a refusal names: the tool, the method, the operation.
    subject: str | None = None


def redacted(value: JsonValue) -> JsonValue:
    """`value` with the values of secret-looking keys REDACTED, at any depth."""
    if isinstance(value, dict):
        return {k: REDACTED if is_secret_name(k) else redacted(v) for k, v in value.items()}
    if isinstance(value, list):
        return [redacted(v) for v in value]
    return value


def session_digest(session_id: str | None) -> str | None:
    """sha256 (hex) of an Mcp-Session-Id value; None without one."""
    if session_id is None:
        return None
    return hashlib.sha256(session_id.encode("utf-8", "surrogatepass")).hexdigest()


def _place(rpc: RpcMessage, size: int) -> dict[str, Any]:
    return {"id": rpc.id, "batch_index": rpc.index, "batch_size": size}


def mcp_inputs(body: McpBody, session_id: str | None) -> tuple[MessageInput, ...]:
    """One `input.mcp` per message of an MCP body; `session_id`: the Mcp-Session-Id header."""
    session = session_digest(session_id)
    size = len(body.messages)
    return tuple(_mcp_input(m, size, session) for m in body.messages)


def _mcp_input(message: McpMessage, size: int, session: str | None) -> MessageInput:
    rpc = message.rpc
    value: dict[str, Any] = {
        "kind": rpc.kind.value,
        "method": rpc.method,
        "tool": message.tool,
        "arguments": redacted(message.arguments) if message.arguments is not None else None,
        "uri": message.uri,
        "prompt": message.prompt,
        **_place(rpc, size),
        "session": session,
    }
    subject = message.tool or message.uri or message.prompt or rpc.method
    return MessageInput(("mcp", value), rpc.index, rpc.id, rpc.has_id, subject)


def jsonrpc_inputs(body: RpcBody) -> tuple[MessageInput, ...]:
    """One `input.jsonrpc` per message of a JSON-RPC body."""
    size = len(body.messages)
    out = []
    for rpc in body.messages:
        value: dict[str, Any] = {
            "kind": rpc.kind.value,
            "method": rpc.method,
            "params": redacted(rpc.params) if rpc.params is not None else None,
            **_place(rpc, size),
        }
        out.append(MessageInput(("jsonrpc", value), rpc.index, rpc.id, rpc.has_id, rpc.method))
    return tuple(out)


def graphql_variables(body: JsonValue) -> tuple[JsonValue, ...]:
    """The `variables` of each request of a parsed GraphQL body (None where absent), in order."""
    members = body if isinstance(body, list) else [body]
    return tuple(m.get("variables") if isinstance(m, dict) else None for m in members)


def graphql_inputs(
    requests: Sequence[GraphqlRequest], variables: Sequence[JsonValue]
) -> tuple[MessageInput, ...]:
    """One `input.graphql` per operation of each request (one for a request without operations).

    `variables`: each request's, from graphql_variables of the same body (a shorter sequence
    leaves the rest null)."""
    size = len(requests)
    out = []
    for i, request in enumerate(requests):
        given = variables[i] if i < len(variables) else None
        shared: dict[str, Any] = {
            "variables": redacted(given) if isinstance(given, dict) else None,
            "persisted_sha256": request.persisted_hash,
            "introspection": request.introspection,
            "batch_index": i if size > 1 else None,
            "batch_size": size,
        }
        operations: Sequence[GraphqlOperation | None] = request.operations or (None,)
        for op in operations:
            value = {**_operation(op, request), **shared}
            subject = None if op is None else f"{op.type} {op.name or '(anonymous)'}"
            out.append(MessageInput(("graphql", value), i, subject=subject))
    return tuple(out)


def _operation(op: GraphqlOperation | None, request: GraphqlRequest) -> dict[str, Any]:
    if op is None:
        return {"operation_type": None, "operation_name": None, "root_fields": [], "selected": False}
    return {
        "operation_type": op.type,
        "operation_name": op.name,
        "root_fields": list(op.root_fields),
        "selected": op is request.selected,
    }
