"""Reason codes of decisions inside an agent protocol (MCP, JSON-RPC, GraphQL).

They extend sandgate.policy.reasons.Reason and are meant to join it once the gateway
answers with them; until then a protocol decision's reason is a `Reason` where one fits
(`allowed`, `invalid_request`, `approval_required`) and one of these otherwise. Never
reuse a code for another meaning (`method_not_allowed` is the HTTP method's).
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["ProtocolReason"]


class ProtocolReason(StrEnum):
    """Why a message inside a protocol was refused."""

    TOOL_NOT_ALLOWED = "tool_not_allowed"
    TOOL_DENIED = "tool_denied"
    ARGUMENT_NOT_ALLOWED = "argument_not_allowed"
    RESOURCE_NOT_ALLOWED = "resource_not_allowed"
    PROMPT_NOT_ALLOWED = "prompt_not_allowed"
    RPC_METHOD_NOT_ALLOWED = "rpc_method_not_allowed"
    OPERATION_NOT_ALLOWED = "operation_not_allowed"
    FIELD_NOT_ALLOWED = "field_not_allowed"
    INTROSPECTION_NOT_ALLOWED = "introspection_not_allowed"
    QUERY_TOO_COMPLEX = "query_too_complex"
    PERSISTED_QUERY_UNKNOWN = "persisted_query_unknown"
    # A call refused only because another call of its batch was (batches are all or nothing).
    BATCH_REFUSED = "batch_refused"
