"""The Rego input document: a versioned contract, built from a request, with secrets redacted.

Version 2, field by field (`sandgate policy schema --input` prints it as JSON Schema):

    version      2 (version 1 had every field below but `mcp`, `jsonrpc`, `graphql` and the
                 phase "message"; a policy written for 1 reads a version 2 document the same)
    phase        "connect" | "tls" | "request" | "message"
    tenant       the tenant's name (from the sandbox's identity, never from the request)
    sandbox      the sandbox id
    client       the guest's address (IP), or null
    dest         {host, port, ip, sni, scheme}: the normalised host, the port, the address
                 the gateway resolved, checked and will dial, the TLS SNI, "http"/"https"
    request      {method, path, query, headers, body_size}: null fields before the HTTP
                 layer (phase "connect"); `path` normalised (sandgate.policy.paths), without
                 query or fragment, "\\u0000unparseable" when servers could read it
                 differently (check paths by allow-list); `query`
                 maps each name to its values; `headers` maps lower-case names to values
                 (repeats joined with ", "); `body_size` is the declared length, or null
    credentials  names of the credentials the broker would use for this request
    mcp          phase "message" only, for a body an `mcp:` rule allowed: one message of it,
                 {kind, method, tool, arguments, uri, prompt, id, batch_index, batch_size,
                 session} (sandgate.policy.rego.message_input)
    jsonrpc      phase "message", a `jsonrpc:` rule's body: {kind, method, params, id,
                 batch_index, batch_size}
    graphql      phase "message", a `graphql:` rule's body: one operation of one request,
                 {operation_type, operation_name, root_fields, selected, variables,
                 persisted_sha256, introspection, batch_index, batch_size}

A "message" document is the request's document (phase "request" fields as they were) with
the phase "message" and one of `mcp`, `jsonrpc`, `graphql`; the other phases have none of them.

Header and query values whose name looks secret (authorization, proxy-authorization,
cookie, x-api-key, or containing token, secret, key, password, credential, session,
signature, auth) are replaced by "REDACTED": the name stays, so a policy can test presence.
The same rule redacts the values of secret-looking keys at any depth of MCP arguments,
JSON-RPC params and GraphQL variables; the other argument values are passed as sent (they
hold at most placeholders: real credentials are injected after every decision).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal
from urllib.parse import parse_qsl

from pydantic import BaseModel, ConfigDict, Field

from sandgate.policy.decision import EgressRequest, Identity
from sandgate.policy.rego.source import InputPaths

__all__ = [
    "INPUT_VERSION",
    "MESSAGE_PHASE",
    "MESSAGE_PROTOCOLS",
    "REDACTED",
    "MessageField",
    "PathTree",
    "cache_key",
    "input_document",
    "input_schema",
    "is_secret_name",
    "path_tree",
    "project",
    "projected_input",
]

INPUT_VERSION = 2
REDACTED = "REDACTED"
# The phase of a document about one message of a body an agent-protocol rule allowed.
MESSAGE_PHASE = "message"
# The fields a "message" document carries one of, by the rule section that read the body.
MESSAGE_PROTOCOLS = ("mcp", "jsonrpc", "graphql")

_SECRET_NAMES = frozenset({"authorization", "proxy-authorization", "cookie", "set-cookie", "x-api-key"})
_SECRET_PARTS = ("token", "secret", "key", "password", "passwd", "credential", "session", "signature", "auth")

# A path tree: {"request": {"method": True}} reads input.request.method only; True is a whole subtree.
PathTree = Mapping[str, "PathTree | bool"]
# One message's field of a "message" document: ("mcp", {...}), ("jsonrpc", {...}), ("graphql", {...}).
MessageField = tuple[str, Mapping[str, Any]]


def is_secret_name(name: str) -> bool:
    """Whether a header or query parameter name looks like it carries a secret."""
    lowered = name.lower()
    return lowered in _SECRET_NAMES or any(part in lowered for part in _SECRET_PARTS)


# Each field of the document, built on its own, in the document's order: input_document
# builds them all, projected_input only those a policy reads.
_DEST: dict[str, Callable[[EgressRequest, str | None], Any]] = {
    "host": lambda r, ip: r.host,
    "port": lambda r, ip: r.port,
    "ip": lambda r, ip: ip,
    "sni": lambda r, ip: r.sni,
    "scheme": lambda r, ip: r.scheme,
}
_REQUEST: dict[str, Callable[[EgressRequest], Any]] = {
    "method": lambda r: r.method,
    "path": lambda r: r.path,
    "query": lambda r: _query(r.query),
    "headers": lambda r: _headers(r.headers),
    "body_size": lambda r: r.body_size,
}
_TOP: dict[str, Callable[[Identity, EgressRequest], Any]] = {
    "version": lambda i, r: INPUT_VERSION,
    "phase": lambda i, r: r.phase.value,
    "tenant": lambda i, r: i.tenant,
    "sandbox": lambda i, r: i.sandbox,
    "client": lambda i, r: r.client,
}
_WHOLE: PathTree = {**dict.fromkeys(_TOP, True), "dest": True, "request": True, "credentials": True}


def input_document(
    identity: Identity, request: EgressRequest, ip: str | None, message: MessageField | None = None
) -> dict[str, Any]:
    """The input document (version 2) for one request; `ip` is the address that will be dialled.
    With `message`: the document of that message (phase "message")."""
    return projected_input(identity, request, ip, None, message)


def projected_input(
    identity: Identity,
    request: EgressRequest,
    ip: str | None,
    tree: PathTree | None,
    message: MessageField | None = None,
) -> dict[str, Any]:
    """`project(input_document(identity, request, ip, message), tree)`, without building the
    fields the tree leaves out (header redaction and query parsing cost more than the rest together)."""
    out: dict[str, Any] = {}
    whole = _WHOLE if message is None else {**_WHOLE, message[0]: True}
    for key, sub in (whole if tree is None else tree).items():
        if sub is True:
            if key == "phase" and message is not None:
                out[key] = MESSAGE_PHASE
            elif key in _TOP:
                out[key] = _TOP[key](identity, request)
            elif key == "dest":
                out[key] = {k: build(request, ip) for k, build in _DEST.items()}
            elif key == "request":
                out[key] = {k: build(request) for k, build in _REQUEST.items()}
            elif key == "credentials":
                out[key] = list(request.credentials)
            elif message is not None and key == message[0]:
                out[key] = message[1]
        elif isinstance(sub, Mapping):
            if key == "dest":
                out[key] = project({k: _DEST[k](request, ip) for k in sub if k in _DEST}, sub)
            elif key == "request":
                out[key] = project({k: _REQUEST[k](request) for k in sub if k in _REQUEST}, sub)
            elif message is not None and key == message[0]:
                out[key] = project(message[1], sub)
    return out


def _headers(headers: Iterable[tuple[str, str]]) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in headers:
        key = name.lower()
        shown = REDACTED if is_secret_name(key) else value
        out[key] = f"{out[key]}, {shown}" if key in out else shown
    return out


def _query(query: str | None) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    if not query:
        return out
    for name, value in parse_qsl(query, keep_blank_values=True):
        out.setdefault(name, []).append(REDACTED if is_secret_name(name) else value)
    return out


def path_tree(paths: InputPaths) -> PathTree | None:
    """The tree of input paths a policy reads; None when it reads the whole input."""
    if paths is None:
        return None
    root: dict[str, Any] = {}
    for path in sorted(paths, key=len):
        node = root
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if child is True:
                break
            node = child
        else:
            node[path[-1]] = True
    return root


def project(doc: Mapping[str, Any], tree: PathTree | None) -> Mapping[str, Any]:
    """Only the parts of `doc` that `tree` names (the whole document when tree is None)."""
    if tree is None:
        return doc
    out: dict[str, Any] = {}
    for key, sub in tree.items():
        if key not in doc:
            continue
        value = doc[key]
        if sub is True:
            out[key] = value
        elif isinstance(value, Mapping) and isinstance(sub, Mapping):
            out[key] = project(value, sub)
    return out


def cache_key(projected: Mapping[str, Any]) -> str:
    """A canonical text for a projected document (distinguishes 1, 1.0, true and "1")."""
    return json.dumps(projected, sort_keys=True, separators=(",", ":"))


# --- the JSON Schema of the input document -------------------------------------------------


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DestInput(_Model):
    """Where the request goes."""

    host: str = Field(description="normalised host: lowercase A-labels, or a canonical IP literal")
    port: int = Field(ge=1, le=65535, description="the destination port")
    ip: str | None = Field(description="the address the gateway resolved, checked and will dial")
    sni: str | None = Field(description="the TLS ClientHello SNI, when known")
    scheme: Literal["http", "https"] | None = Field(description="null at phase connect")


class RequestInput(_Model):
    """The HTTP request; every field is null (headers and query empty) at phase connect."""

    method: str | None = Field(description="the HTTP method, in upper case")
    path: str | None = Field(description="normalised path without the query")
    query: dict[str, list[str]] = Field(description="name → values; secret-looking values REDACTED")
    headers: dict[str, str] = Field(
        description="lower-case name → value (repeats joined with ', '); secret-looking values REDACTED"
    )
    body_size: int | None = Field(description="declared body length in bytes, or null")


MessageKind = Literal["request", "notification", "response"]
RpcIdInput = str | int | None


class McpInput(_Model):
    """One MCP message of a body an `mcp:` rule allowed (phase message only)."""

    kind: MessageKind = Field(
        description="request (has an id), notification (none), response (to the server)"
    )
    method: str | None = Field(
        description="the JSON-RPC method (tools/call, resources/read ...); null: a response"
    )
    tool: str | None = Field(description="tools/call: the tool's name (canonical), else null")
    arguments: dict[str, Any] | None = Field(
        description=(
            "tools/call: its arguments ({} when absent), secret-looking keys' values REDACTED; else null"
        )
    )
    uri: str | None = Field(description="resources/read, subscribe, unsubscribe: the resource URI, else null")
    prompt: str | None = Field(description="prompts/get: the prompt's name, else null")
    id: RpcIdInput = Field(description="the JSON-RPC id (string, integer or null; null for a notification)")
    batch_index: int | None = Field(
        description="its place in a batch (0-based); null when the body is one message"
    )
    batch_size: int = Field(ge=1, description="messages in the body (1 when it is one message)")
    session: str | None = Field(
        description=(
            "sha256 (hex) of the request's Mcp-Session-Id header, never the value (a session id is a bearer "
            "token); null without the header"
        )
    )


class JsonRpcInput(_Model):
    """One JSON-RPC message of a body a `jsonrpc:` rule allowed (phase message only)."""

    kind: MessageKind = Field(description="request, notification or response")
    method: str | None = Field(description="the method; null for a response")
    params: dict[str, Any] | list[Any] | None = Field(
        description=(
            "the params as sent (object or array; null when absent), secret-looking keys' values REDACTED"
        )
    )
    id: RpcIdInput = Field(description="the JSON-RPC id (null for a notification)")
    batch_index: int | None = Field(
        description="its place in a batch (0-based); null when the body is one message"
    )
    batch_size: int = Field(ge=1, description="messages in the body (1 when it is one message)")


class GraphqlInput(_Model):
    """One operation of one GraphQL request a `graphql:` rule allowed (phase message only);
    every operation of the document is asked about, not only the one that would run."""

    operation_type: Literal["query", "mutation", "subscription"] | None = Field(
        description="the operation's type; null for a persisted query sent without its text"
    )
    operation_name: str | None = Field(description="the operation's name, or null when anonymous")
    root_fields: list[str] = Field(
        description="its root field names (sorted, fragments resolved, no aliases)"
    )
    selected: bool = Field(
        description="true for the operation the request's operationName selects (or the only one)"
    )
    variables: dict[str, Any] | None = Field(
        description="the request's variables (null when absent), secret-looking keys' values REDACTED"
    )
    persisted_sha256: str | None = Field(description="the persisted query's hash, when the request names one")
    introspection: bool = Field(description="__schema or __type anywhere in the request's document")
    batch_index: int | None = Field(
        description="the request's place in a batch; null when the body is one request"
    )
    batch_size: int = Field(ge=1, description="requests in the body (1 when it is one request)")


class InputDocument(_Model):
    """The input of `data.sandgate.decision` (version 2)."""

    version: Literal[2] = Field(description="the version of this document's contract")
    phase: Literal["connect", "tls", "request", "message"] = Field(
        description=(
            "connect: a CONNECT or a new transparent connection; tls: its ClientHello; request: each HTTP "
            "request; message: each message of a body an mcp:, jsonrpc: or graphql: rule allowed, asked only "
            "when the tenant's Rego reads input.mcp, input.jsonrpc or input.graphql"
        )
    )
    tenant: str = Field(description="the tenant's name (from the sandbox's identity, never from the request)")
    sandbox: str = Field(description="the sandbox id")
    client: str | None = Field(description="the guest's address")
    dest: DestInput
    request: RequestInput
    credentials: list[str] = Field(description="names of the credentials the broker would use")
    mcp: McpInput | None = Field(default=None, description="phase message, an mcp: rule's body: the message")
    jsonrpc: JsonRpcInput | None = Field(
        default=None, description="phase message, a jsonrpc: rule's body: the message"
    )
    graphql: GraphqlInput | None = Field(
        default=None, description="phase message, a graphql: rule's body: one operation"
    )


def input_schema() -> dict[str, Any]:
    """JSON Schema of the Rego input document."""
    schema = InputDocument.model_json_schema()
    schema["title"] = f"sandgate Rego input, version {INPUT_VERSION}"
    return schema
