"""The bodies agent-protocol rules decide: read one strict way, decided, answered, recorded.

Shared by the HTTP addons (sandgate.proxy.addons.agent_protocols, agent_lists) and anything
else that carries the same messages: the body is decoded from its Content-Encoding (gzip,
deflate, br, zstd; stacked or unknown encodings cannot be read) within the gateway's bounds
(`BodyBounds`: bytes, nesting, batch members, GraphQL's query limits, from the gateway
config's `agent_protocols:` section; MAX_BODY bytes by default), read by the rule's section
(`mcp:`, `jsonrpc:`, `graphql:`; sandgate.policy.protocols), and a refused one is answered
in its protocol (JSON-RPC errors, one per request id, in an HTTP 200; a GraphQL error
object). Records carry what was asked and decided, never an argument's value.

A GraphQL call may also come as a GET (GraphQL over HTTP): `graphql_get_body` turns its query
string into the JSON body the decider reads, strictly (each of `query`, `operationName`,
`variables`, `extensions` at most once, no other parameter, percent-encoded UTF-8, strict JSON
for `variables` and `extensions`), and `decide_graphql_get` decides it like that body and
refuses any operation other than a query (a GET must not change anything).
"""

from __future__ import annotations

import hashlib
import json
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass

from mitmproxy import http

from sandgate.brokers.decoding import UndecodableBody, stream_decoder
from sandgate.policy.protocols.answers import graphql_refusal_answer, refusal_answer
from sandgate.policy.protocols.arguments import values_at
from sandgate.policy.protocols.decide import (
    BodyVerdict,
    MessageVerdict,
    Verdict,
    decide_graphql_body,
    decide_jsonrpc_body,
    decide_mcp_body,
)
from sandgate.policy.protocols.errors import Problem, ProtocolError
from sandgate.policy.protocols.graphql_ops import DEFAULT_GRAPHQL_LIMITS, GraphqlLimits, GraphqlRequest
from sandgate.policy.protocols.json_strict import DEFAULT_LIMITS, JsonLimits, JsonValue, loads_strict
from sandgate.policy.protocols.jsonrpc import DEFAULT_MAX_BATCH, RpcBody, RpcMessage
from sandgate.policy.protocols.mcp import TOOLS_CALL, McpBody, McpMessage
from sandgate.policy.protocols.reasons import ProtocolReason
from sandgate.policy.protocols.rules import GraphqlSection, JsonRpcSection, McpSection
from sandgate.policy.reasons import Reason
from sandgate.proxy.approvals.tool_calls import masked_placeholders
from sandgate.proxy.config import AgentProtocolsConfig
from sandgate.proxy.respond import DECISION_HEADER, REASON_HEADER

__all__ = [
    "DEFAULT_BOUNDS",
    "GRAPHQL_GET_PARAMETERS",
    "MAX_BODY",
    "RECORDED_VALUE_MAX",
    "BodyBounds",
    "ReadBody",
    "Section",
    "Unreadable",
    "arguments_digest",
    "body_facts",
    "bounds_of",
    "decide_body",
    "decide_graphql_get",
    "decoded",
    "graphql_get_body",
    "protocol_answer",
    "recorded_arguments",
    "refusal_response",
    "unreadable_verdict",
]


@dataclass(frozen=True, slots=True)
class BodyBounds:
    """How much of a body (or WebSocket message, or list answer) the gateway reads to decide
    it: bytes and nesting (the strict JSON reader's limits), JSON-RPC batch members, and
    GraphQL's query limits. Past any of them: `invalid_request`, never passed unread."""

    json: JsonLimits = DEFAULT_LIMITS
    max_batch: int = DEFAULT_MAX_BATCH
    graphql: GraphqlLimits = DEFAULT_GRAPHQL_LIMITS

    @property
    def max_body(self) -> int:
        """The most a decided body may be, encoded or decoded."""
        return self.json.max_bytes


DEFAULT_BOUNDS = BodyBounds()
# Today's (and the config's default) bound on a decided body: the strict JSON reader's own.
MAX_BODY = DEFAULT_BOUNDS.max_body
# GraphQL over HTTP's GET parameters, exactly as spelled there; the last two are JSON.
GRAPHQL_GET_PARAMETERS = ("query", "operationName", "variables", "extensions")
_GRAPHQL_GET_JSON = frozenset({"variables", "extensions"})

type Section = McpSection | JsonRpcSection | GraphqlSection
# What a body was read as: MCP or JSON-RPC messages, GraphQL requests; None: not read.
type ReadBody = McpBody | RpcBody | tuple[GraphqlRequest, ...] | None


class Unreadable(Exception):
    """A body that cannot be read where a rule needs it; the message says why (no body bytes)."""

    def __init__(self, detail: str, problem: Problem | None = None) -> None:
        super().__init__(detail)
        self.problem = problem


def bounds_of(config: AgentProtocolsConfig) -> BodyBounds:
    """The bounds the gateway config's `agent_protocols:` section sets."""
    graphql = config.graphql
    return BodyBounds(
        json=JsonLimits(max_bytes=config.max_body_bytes, max_depth=config.max_depth),
        max_batch=config.max_batch,
        graphql=GraphqlLimits(
            max_bytes=graphql.max_query_bytes,
            max_tokens=graphql.max_tokens,
            max_nesting=graphql.max_nesting,
            max_nodes=DEFAULT_GRAPHQL_LIMITS.max_nodes,
            max_batch=graphql.max_batch,
        ),
    )


def decoded(raw: bytes, content_encoding: str | None, limit: int = MAX_BODY) -> bytes:
    """The body as its Content-Encoding says, at most `limit` bytes; Unreadable otherwise."""
    name = (content_encoding or "").strip().lower()
    if name in ("", "identity"):
        return raw
    decoder = stream_decoder(name)
    if decoder is None:
        raise Unreadable(f"content encoding {name[:40]!r} cannot be decoded here")
    out = bytearray()
    try:
        for piece in _chain(decoder.feed(raw), decoder.finish()):
            out += piece
            if len(out) > limit:
                raise Unreadable(f"a decoded body over the {limit} bytes a rule reads", Problem.TOO_LARGE)
    except UndecodableBody as e:
        raise Unreadable(str(e)) from None
    return bytes(out)


def _chain(*parts: Iterable[bytes]) -> Iterable[bytes]:
    for part in parts:
        yield from part


def decide_body(
    section: Section, raw: bytes, content_encoding: str | None, bounds: BodyBounds = DEFAULT_BOUNDS
) -> tuple[BodyVerdict, ReadBody]:
    """The verdict on a request body under `section` within `bounds`, and what it read (None: unread)."""
    try:
        data = decoded(raw, content_encoding, bounds.max_body)
    except Unreadable as e:
        return unreadable_verdict(e), None
    if isinstance(section, McpSection):
        return decide_mcp_body(data, section, bounds.json, max_batch=bounds.max_batch)
    if isinstance(section, GraphqlSection):
        verdict, requests = decide_graphql_body(data, section, bounds.json, bounds.graphql)
        return verdict, requests or None
    return decide_jsonrpc_body(data, section, bounds.json, max_batch=bounds.max_batch)


def graphql_get_body(query_string: str, bounds: BodyBounds = DEFAULT_BOUNDS) -> bytes:
    """The JSON body a GraphQL-over-HTTP GET's query string (what follows `?`) stands for;
    Unreadable for a parameter repeated, unknown (also one of ours spelled otherwise), not
    percent-encoded UTF-8, or, for `variables` and `extensions`, not strict JSON."""
    if len(query_string) > bounds.max_body:
        raise Unreadable(f"a query string over the {bounds.max_body} bytes a rule reads", Problem.TOO_LARGE)
    try:
        pairs = urllib.parse.parse_qsl(
            query_string,
            keep_blank_values=True,
            strict_parsing=True,
            encoding="utf-8",
            errors="strict",
            max_num_fields=len(GRAPHQL_GET_PARAMETERS),
        )
    except UnicodeDecodeError:
        raise Unreadable("a query parameter not percent-encoded UTF-8", Problem.INVALID_UTF8) from None
    except ValueError:
        # Never the parser's message: it quotes the query string.
        raise Unreadable("a query string not of `name=value` pairs joined by `&`, at most four") from None
    body: dict[str, JsonValue] = {}
    for name, value in pairs:
        if name not in GRAPHQL_GET_PARAMETERS:
            raise Unreadable("a query parameter other than query, operationName, variables and extensions")
        if name in body:
            raise Unreadable(f"query parameter {name!r} given more than once")
        if name not in _GRAPHQL_GET_JSON:
            body[name] = value
            continue
        try:
            body[name] = loads_strict(value, bounds.json)
        except ProtocolError as e:
            raise Unreadable(f"query parameter {name!r} is not strict JSON ({e.code})", e.code) from None
    return json.dumps(body, separators=(",", ":")).encode()


def decide_graphql_get(
    section: GraphqlSection, query_string: str, bounds: BodyBounds = DEFAULT_BOUNDS
) -> tuple[BodyVerdict, ReadBody]:
    """A GraphQL-over-HTTP GET, decided as the body `graphql_get_body` makes of its query
    string; then any operation of its document other than a query is refused (GraphQL over
    HTTP: a GET never runs a mutation), whatever `operation_types` allows."""
    try:
        body = graphql_get_body(query_string, bounds)
    except Unreadable as e:
        return unreadable_verdict(e), None
    verdict, read = decide_body(section, body, None, bounds)
    if not verdict.allowed or not isinstance(read, tuple):
        return verdict, read
    for i, request in enumerate(read):
        changing = next((op for op in request.operations if op.type != "query"), None)
        if changing is not None:
            detail = f"a {changing.type} sent with GET: GraphQL over HTTP runs only queries there"
            reason = ProtocolReason.OPERATION_NOT_ALLOWED
            refused = MessageVerdict(Verdict.DENY, reason, None, detail, index=i)
            return BodyVerdict(Verdict.DENY, reason, None, detail, (refused,)), read
    return verdict, read


def unreadable_verdict(error: Unreadable) -> BodyVerdict:
    return BodyVerdict(Verdict.DENY, Reason.INVALID_REQUEST, None, str(error), problem=error.problem)


def refusal_response(section: Section, verdict: BodyVerdict, decision_id: str) -> http.Response:
    """The answer to a refused body in its protocol: 200 with a JSON-RPC error per request id
    (202 and no body when only notifications were refused, MCP's answer to notifications), or
    200 with GraphQL `errors`."""
    answer = protocol_answer(section, verdict)
    headers = {
        REASON_HEADER: str(verdict.reason),
        DECISION_HEADER: decision_id,
        "Cache-Control": "no-store",
    }
    if answer is None:
        return http.Response.make(202, b"", headers)
    headers["Content-Type"] = "application/json"
    return http.Response.make(200, json.dumps(answer).encode(), headers)


def protocol_answer(section: Section, verdict: BodyVerdict) -> JsonValue:
    """The refused body's answer in its protocol: JSON-RPC errors (None: only notifications
    were refused, nothing to answer) or GraphQL `errors`."""
    if isinstance(section, GraphqlSection):
        return graphql_refusal_answer(verdict)
    return refusal_answer(verdict)


def arguments_digest(arguments: JsonValue) -> str:
    """sha256 of the arguments' canonical JSON (sorted keys, no spaces): equal calls, equal digests."""
    canonical = json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()


def body_facts(section: Section, verdict: BodyVerdict, body: ReadBody, *, report: bool) -> dict[str, object]:
    """The record's `mcp`, `jsonrpc` or `graphql` object: what was asked and decided, no
    argument or variable values."""
    outcome = str(verdict.verdict)
    if report and verdict.verdict is not Verdict.ALLOW:
        outcome = "would_deny"
    if isinstance(section, GraphqlSection):
        graphql = body if isinstance(body, tuple) else ()
        return {"graphql": _graphql_facts(verdict, graphql, outcome)}
    assert not isinstance(body, tuple)
    messages: list[dict[str, object]] = []
    read: list[tuple[RpcMessage, McpMessage | None]] = []
    if isinstance(body, McpBody):
        read = [(m.rpc, m) for m in body.messages]
    elif body is not None:
        read = [(m, None) for m in body.messages]
    for i, (rpc, mcp) in enumerate(read):
        fact: dict[str, object] = {"method": rpc.method, "kind": str(rpc.kind)}
        if rpc.has_id:
            fact["id"] = rpc.id
        if mcp is not None and rpc.method == TOOLS_CALL:
            fact["tool"] = mcp.tool
            fact["arguments_sha256"] = arguments_digest(mcp.arguments or {})
            if isinstance(section, McpSection) and mcp.tool is not None:
                chosen = recorded_arguments(section, mcp.tool, mcp.arguments or {})
                if chosen:
                    fact["arguments"] = chosen
        if i < len(verdict.messages):
            decided = verdict.messages[i]
            fact.update(verdict=str(decided.verdict), reason=str(decided.reason), rule=decided.rule)
        messages.append(fact)
    facts: dict[str, object] = {
        "verdict": outcome,
        "reason": str(verdict.reason),
        "rule": verdict.rule,
        "batch": len(body.messages) if body is not None and body.batch else None,
        "messages": messages,
    }
    if verdict.problem is not None:
        facts["problem"] = str(verdict.problem)
    return {"mcp" if isinstance(section, McpSection) else "jsonrpc": facts}


def _graphql_facts(
    verdict: BodyVerdict, requests: tuple[GraphqlRequest, ...], outcome: str
) -> dict[str, object]:
    """Per request its operations (type, name, root fields) and persisted-query id, decided."""
    facts_of_requests: list[dict[str, object]] = []
    for i, request in enumerate(requests):
        fact: dict[str, object] = {
            "operations": [
                {"type": op.type, "name": op.name, "root_fields": list(op.root_fields[:32])}
                for op in request.operations[:16]
            ],
        }
        if request.persisted_hash is not None:
            fact["persisted_sha256"] = request.persisted_hash
        if i < len(verdict.messages):
            decided = verdict.messages[i]
            fact.update(verdict=str(decided.verdict), reason=str(decided.reason), rule=decided.rule)
        facts_of_requests.append(fact)
    facts: dict[str, object] = {
        "verdict": outcome,
        "reason": str(verdict.reason),
        "rule": verdict.rule,
        "batch": len(requests) if len(requests) > 1 else None,
        "requests": facts_of_requests,
    }
    if verdict.problem is not None:
        facts["problem"] = str(verdict.problem)
    return facts


# The most of one recorded argument value: a record stays small whatever the agent sends.
RECORDED_VALUE_MAX = 256


def recorded_arguments(
    section: McpSection, tool: str, arguments: dict[str, JsonValue]
) -> dict[str, JsonValue]:
    """The argument values a rule's `mcp.tools.record` asks the record to carry, by path:
    scalars as sent (strings cut at RECORDED_VALUE_MAX), a path reaching several values a list,
    anything else its JSON type's name; placeholders masked. Missing paths are left out."""
    chosen: dict[str, JsonValue] = {}
    for path in section.tools.recorded_paths(tool):
        values = [_recordable(v) for v in values_at(path, arguments)]
        if values:
            chosen[path] = values[0] if len(values) == 1 and "[*]" not in path else values[:32]
    return chosen


def _recordable(value: JsonValue) -> JsonValue:
    if isinstance(value, str):
        masked: str = masked_placeholders(value)
        return masked if len(masked) <= RECORDED_VALUE_MAX else masked[:RECORDED_VALUE_MAX] + "..."
    if isinstance(value, dict | list):
        return f"<{'object' if isinstance(value, dict) else 'array'}>"
    return value
