"""The one enum of reason codes: the `X-Sandgate-Reason` header, the audit `reason`, Rego results.

Each code's meaning and HTTP status live beside it in `MEANINGS`; the manual's reason-code
table (docs/reference/reason-codes.md) is generated from them and tested against them.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType

__all__ = ["MEANINGS", "Meaning", "Reason", "markdown_table"]


class Reason(StrEnum):
    """Why a decision came out as it did. Never reuse a code for another meaning."""

    ALLOWED = "allowed"
    NO_IDENTITY = "no_identity"
    HOST_NOT_ALLOWED = "host_not_allowed"
    HOST_DENIED = "host_denied"
    PORT_NOT_ALLOWED = "port_not_allowed"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    PATH_NOT_ALLOWED = "path_not_allowed"
    PRIVATE_ADDRESS = "private_address"
    DNS_FAILURE = "dns_failure"
    DNS_DENIED = "dns_denied"
    SNI_MISMATCH = "sni_mismatch"
    HOST_MISMATCH = "host_mismatch"
    PROTOCOL_NOT_ALLOWED = "protocol_not_allowed"
    POLICY_DENIED = "policy_denied"
    POLICY_ERROR = "policy_error"
    CREDENTIAL_HOST_MISMATCH = "credential_host_mismatch"
    RATE_LIMITED = "rate_limited"
    BODY_TOO_LARGE = "body_too_large"
    INTERNAL_ERROR = "internal_error"
    INVALID_REQUEST = "invalid_request"
    UNKNOWN_PLACEHOLDER = "unknown_placeholder"
    HEADER_TOO_LARGE = "header_too_large"
    HEADER_TIMEOUT = "header_timeout"
    UPGRADE_NOT_ALLOWED = "upgrade_not_allowed"
    UPSTREAM_UNREACHABLE = "upstream_unreachable"
    CONNECTION_LIMIT = "connection_limit"
    PROTOCOL_ABUSE = "protocol_abuse"
    UPSTREAM_PROTOCOL_ERROR = "upstream_protocol_error"
    APPROVAL_REQUIRED = "approval_required"
    APPROVAL_DENIED = "approval_denied"
    APPROVAL_TIMEOUT = "approval_timeout"
    APPROVAL_QUEUE_FULL = "approval_queue_full"
    RESERVED_HOST = "reserved_host"
    MESSAGE_TOO_LARGE = "message_too_large"
    # Inside an agent protocol (sandgate.policy.protocols.reasons): answered as JSON-RPC errors.
    TOOL_NOT_ALLOWED = "tool_not_allowed"
    TOOL_DENIED = "tool_denied"
    ARGUMENT_NOT_ALLOWED = "argument_not_allowed"
    RESOURCE_NOT_ALLOWED = "resource_not_allowed"
    PROMPT_NOT_ALLOWED = "prompt_not_allowed"
    RPC_METHOD_NOT_ALLOWED = "rpc_method_not_allowed"
    BATCH_REFUSED = "batch_refused"
    # Inside GraphQL (sandgate.policy.protocols.reasons): answered as GraphQL errors.
    OPERATION_NOT_ALLOWED = "operation_not_allowed"
    FIELD_NOT_ALLOWED = "field_not_allowed"
    INTROSPECTION_NOT_ALLOWED = "introspection_not_allowed"
    QUERY_TOO_COMPLEX = "query_too_complex"
    PERSISTED_QUERY_UNKNOWN = "persisted_query_unknown"


@dataclass(frozen=True, slots=True)
class Meaning:
    """What a code means (one line), and the HTTP statuses an answer with it has, usual first;
    none when nothing HTTP is answered (an allow, a closed handshake, a DNS answer, GOAWAY)."""

    text: str
    statuses: tuple[int, ...] = (403,)


MEANINGS: Mapping[Reason, Meaning] = MappingProxyType(
    {
        Reason.ALLOWED: Meaning("allowed (or, with decision `would_deny`, what report mode let through)", ()),
        Reason.NO_IDENTITY: Meaning(
            "no valid sandbox credential (407 on the explicit proxy), or the sandbox's tenant is gone",
            (407, 403),
        ),
        Reason.HOST_NOT_ALLOWED: Meaning("no allow rule names the host"),
        Reason.HOST_DENIED: Meaning("a deny rule (tenant or base) matches"),
        Reason.PORT_NOT_ALLOWED: Meaning("a rule names the host, not this port"),
        Reason.METHOD_NOT_ALLOWED: Meaning("a rule names host and port, not this method"),
        Reason.PATH_NOT_ALLOWED: Meaning("a rule names host, port and method, not this path"),
        Reason.PRIVATE_ADDRESS: Meaning(
            "the destination is internal (see the address guard); the record's `refused` and the"
            " 403 body name each refused address and why"
        ),
        Reason.DNS_FAILURE: Meaning("the gateway could not resolve an allowed name", (502,)),
        Reason.DNS_DENIED: Meaning(
            "a DNS query for a name the tenant cannot reach (DNS listener: NXDOMAIN)", ()
        ),
        Reason.SNI_MISMATCH: Meaning(
            "the TLS SNI does not name the CONNECT host (the handshake is closed)", ()
        ),
        Reason.HOST_MISMATCH: Meaning("the HTTP Host does not name the connection's destination"),
        Reason.PROTOCOL_NOT_ALLOWED: Meaning(
            "non-HTTP plaintext without a `protocol: tcp` rule, a port no rule allows (transparent),"
            " or TLS straight at the proxy port (closed); a CONNECT in transparent mode (403)"
        ),
        Reason.POLICY_DENIED: Meaning("the tenant's Rego denied, or gave no decision"),
        Reason.POLICY_ERROR: Meaning("the policy engine failed (fault, timeout, unreachable): denied"),
        Reason.CREDENTIAL_HOST_MISMATCH: Meaning(
            "a credential placeholder where its credential is not bound (host, port, scheme, path,"
            " method, or a place its injector does not replace), or another sandbox's"
        ),
        Reason.RATE_LIMITED: Meaning(
            "a tenant limit: `requests_per_minute`, `egress_bytes_per_hour` or their `tenant_` caps"
            " (with `Retry-After`)",
            (429,),
        ),
        Reason.BODY_TOO_LARGE: Meaning(
            "a request body over the tenant's `request_body_bytes`, or a body-injected credential in"
            " a body over its size cap",
            (413,),
        ),
        Reason.INTERNAL_ERROR: Meaning("a fault in the gateway: denied, logged with a traceback"),
        Reason.INVALID_REQUEST: Meaning(
            "a request line, Host or message framing the gateway cannot parse into one destination"
            " (connection closed); or a body an `mcp:`/`jsonrpc:` rule needs that is not strict,"
            " bounded JSON-RPC (a JSON-RPC error in an HTTP 200)",
            (400, 200),
        ),
        Reason.UNKNOWN_PLACEHOLDER: Meaning(
            "a value shaped like a sandgate placeholder that this gateway did not mint (another"
            " gateway's key, a forgery): never forwarded"
        ),
        Reason.HEADER_TOO_LARGE: Meaning(
            "a request head (431) or response head (502) over the size or line-count cap (connection closed)",
            (431, 502),
        ),
        Reason.HEADER_TIMEOUT: Meaning(
            "a request head not read whole within `heads.read_timeout_seconds` (connection closed)",
            (408,),
        ),
        Reason.UPGRADE_NOT_ALLOWED: Meaning(
            "an `Upgrade` no rule allows (only `websocket`, on `websocket: true` rules), or a `101`"
            " the gateway did not approve (both sides closed)"
        ),
        Reason.UPSTREAM_UNREACHABLE: Meaning(
            "an allowed destination that could not be reached (502) or did not answer in time"
            " (504), or whose answer cannot be relayed (HTTP/1 trailers, 502); never 403",
            (502, 504),
        ),
        Reason.CONNECTION_LIMIT: Meaning(
            "a connection over the gateway's caps (per source, per sandbox, file-descriptor"
            " headroom): closed at connect (audited per source and second, `connections` = how"
            " many), or 429 on the explicit proxy once the sandbox is known",
            (429,),
        ),
        Reason.PROTOCOL_ABUSE: Meaning(
            "an HTTP/2 connection that reset or overran streams faster than allowed (rapid reset):"
            " GOAWAY `ENHANCE_YOUR_CALM`, closed",
            (),
        ),
        Reason.UPSTREAM_PROTOCOL_ERROR: Meaning(
            "an allowed destination answered with something that is not valid HTTP, or closed the"
            " connection without an answer",
            (502,),
        ),
        Reason.APPROVAL_REQUIRED: Meaning(
            "an `ask` rule (or `unmatched: ask`) matched: the request is held for an operator's"
            " decision (`sandgate requests`; the audit record's decision is `ask`); refused at once"
            " where it cannot be held (a TLS handshake on the transparent listener, a chunked MCP body)"
        ),
        Reason.APPROVAL_DENIED: Meaning("an operator denied the held request"),
        Reason.APPROVAL_TIMEOUT: Meaning(
            "no decision on the held request within `approvals.ask_timeout_seconds`"
        ),
        Reason.APPROVAL_QUEUE_FULL: Meaning(
            "the sandbox already has `approvals.max_held_per_sandbox` requests open (held, or hung up "
            "and undecided): not held"
        ),
        Reason.RESERVED_HOST: Meaning(
            "the gateway's own name (`approvals.endpoint_name`, default `sandgate.internal`): answered"
            " by the gateway over plain HTTP on port 80 only, never resolved or forwarded; a CONNECT"
            " (403), another port (403) or TLS (closed) to it is refused"
        ),
        Reason.MESSAGE_TOO_LARGE: Meaning(
            "a WebSocket message (from the guest or the upstream) over `websocket.max_message_bytes`:"
            " the session is closed, 1009 to the side that sent it, 1001 to the other",
            (),
        ),
        Reason.TOOL_NOT_ALLOWED: Meaning(
            "an MCP `tools/call` whose tool no `mcp.tools.allow` (or `ask`) glob matches: a JSON-RPC"
            " error for its id in an HTTP 200, the session kept",
            (200,),
        ),
        Reason.TOOL_DENIED: Meaning(
            "an MCP `tools/call` whose tool an `mcp.tools.deny` glob matches (in any case): a JSON-RPC error",
            (200,),
        ),
        Reason.ARGUMENT_NOT_ALLOWED: Meaning(
            "an MCP tool call whose arguments fail an `mcp.tools.arguments` predicate (the error names"
            " it, never the value): a JSON-RPC error",
            (200,),
        ),
        Reason.RESOURCE_NOT_ALLOWED: Meaning(
            "an MCP resource URI the `mcp.resources` lists refuse: a JSON-RPC error", (200,)
        ),
        Reason.PROMPT_NOT_ALLOWED: Meaning(
            "an MCP prompt name the `mcp.prompts` lists refuse: a JSON-RPC error", (200,)
        ),
        Reason.RPC_METHOD_NOT_ALLOWED: Meaning(
            "a JSON-RPC (or MCP) method the rule's `methods` lists refuse: a JSON-RPC error", (200,)
        ),
        Reason.BATCH_REFUSED: Meaning(
            "a JSON-RPC batch member refused because another member of its batch was (batches are"
            " all or nothing; the error names the member): in the answer only",
            (200,),
        ),
        Reason.OPERATION_NOT_ALLOWED: Meaning(
            "a GraphQL operation whose type (`graphql.operation_types`) or name (`operation_names`)"
            " the rule refuses, in any operation of the document, or any but a query sent with GET:"
            " GraphQL `errors` in an HTTP 200",
            (200,),
        ),
        Reason.FIELD_NOT_ALLOWED: Meaning(
            "a GraphQL root field (by its name, never its alias) the `graphql.root_fields` lists"
            " refuse: GraphQL `errors` in an HTTP 200",
            (200,),
        ),
        Reason.INTROSPECTION_NOT_ALLOWED: Meaning(
            "`__schema` or `__type` in a GraphQL document whose rule has no `introspection: true`:"
            " GraphQL `errors` in an HTTP 200",
            (200,),
        ),
        Reason.QUERY_TOO_COMPLEX: Meaning(
            "a GraphQL operation over `graphql.max_depth`, `max_aliases` or `max_fields` (fragments"
            " expanded): GraphQL `errors` in an HTTP 200",
            (200,),
        ),
        Reason.PERSISTED_QUERY_UNKNOWN: Meaning(
            "a GraphQL persisted-query id (`extensions.persistedQuery.sha256Hash`) sent without its"
            " query and not in `graphql.persisted_queries`: GraphQL `errors` in an HTTP 200",
            (200,),
        ),
    }
)


def markdown_table() -> str:
    """The manual's reason-code table: one row per code, in enum order."""
    lines = ["| code | status | meaning |", "|---|---|---|"]
    for reason in Reason:
        meaning = MEANINGS[reason]
        status = " / ".join(f"`{s}`" for s in meaning.statuses) or "—"
        lines.append(f"| `{reason.value}` | {status} | {meaning.text} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m sandgate.policy.reasons --markdown`: print the manual's reason-code table."""
    parser = argparse.ArgumentParser(prog="python -m sandgate.policy.reasons")
    parser.add_argument("--markdown", action="store_true", required=True, help="print the table")
    parser.parse_args(argv)
    print(markdown_table())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
