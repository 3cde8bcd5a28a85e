"""Decisions on agent-protocol messages: allow, deny or ask, with a reason and a rule. Pure.

Batches are all or nothing. When one call of a JSON-RPC batch is denied, the whole batch
is refused: the denied call is answered with its reason, every other request of the batch
with `batch_refused` (naming the denied member), each as a JSON-RPC error for its own id,
in one HTTP 200 answer, so the MCP session stays alive and the agent can resend the
allowed calls on their own. Forwarding the allowed part instead would mean re-serialising
a body the gateway rewrote (the upstream must get the bytes that were decided, not a
second rendering of them), merging the upstream's answer (JSON or an SSE stream) with the
gateway's errors, and running half of a batch the agent may have meant as a unit. MCP
dropped batching in its 2025-06-18 revision, so a refused batch costs a real client little;
a batch that smuggles a denied call beside allowed ones gets nothing through. Likewise a
batch with an `ask` call and no denied one is held whole (one approval releases its exact
bytes). Calls are still decided one by one, so the answer says which member was denied.

Every operation of a GraphQL document, and every request of a GraphQL batch, must pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

from sandgate.policy.protocols.arguments import check_arguments
from sandgate.policy.protocols.errors import Problem, ProtocolError
from sandgate.policy.protocols.graphql_ops import (
    DEFAULT_GRAPHQL_LIMITS,
    INTROSPECTION_FIELDS,
    GraphqlLimits,
    GraphqlOperation,
    GraphqlRequest,
    read_graphql_body,
)
from sandgate.policy.protocols.json_strict import DEFAULT_LIMITS, JsonLimits, JsonValue, loads_strict
from sandgate.policy.protocols.jsonrpc import DEFAULT_MAX_BATCH, Kind, RpcBody, RpcMessage, parse_jsonrpc
from sandgate.policy.protocols.mcp import (
    PROMPTS_GET,
    RESOURCE_METHODS,
    TOOLS_CALL,
    McpBody,
    McpMessage,
    read_mcp,
)
from sandgate.policy.protocols.reasons import ProtocolReason
from sandgate.policy.protocols.rules import (
    GraphqlSection,
    JsonRpcSection,
    McpNames,
    McpResources,
    McpSection,
    McpTools,
    MethodRules,
)
from sandgate.policy.reasons import Reason

__all__ = [
    "BodyVerdict",
    "MessageVerdict",
    "Verdict",
    "decide_graphql",
    "decide_graphql_body",
    "decide_jsonrpc",
    "decide_jsonrpc_body",
    "decide_mcp",
    "decide_mcp_body",
    "decide_tool",
]


class Verdict(StrEnum):
    ALLOW = "allow"
    DENY = "deny"
    ASK = "ask"


@dataclass(frozen=True, slots=True)
class MessageVerdict:
    """The decision on one message. The zero value denies. `rule` names the entry that
    decided (`mcp.tools.deny[2]`), `detail` says how in a sentence free of argument values;
    `index`, `id` and `has_id` say which message of the body it answers."""

    verdict: Verdict = Verdict.DENY
    reason: Reason | ProtocolReason = Reason.INTERNAL_ERROR
    rule: str | None = None
    detail: str = ""
    subject: str | None = None
    index: int | None = None
    id: str | int | None = None
    has_id: bool = False


@dataclass(frozen=True, slots=True)
class BodyVerdict:
    """The decision on a whole body, and on each of its messages (see the module docstring)."""

    verdict: Verdict
    reason: Reason | ProtocolReason
    rule: str | None
    detail: str
    messages: tuple[MessageVerdict, ...] = ()
    batch: bool = False
    # Why the body could not be read (the reason is then invalid_request, and `messages` holds
    # at most the one message whose id could be read).
    problem: Problem | None = None

    @property
    def allowed(self) -> bool:
        return self.verdict is Verdict.ALLOW


def _allow(rule: str | None = None, detail: str = "") -> MessageVerdict:
    return MessageVerdict(Verdict.ALLOW, Reason.ALLOWED, rule, detail)


def _deny(reason: Reason | ProtocolReason, rule: str | None, detail: str) -> MessageVerdict:
    return MessageVerdict(Verdict.DENY, reason, rule, detail)


def _invalid(error: ProtocolError) -> BodyVerdict:
    """An unreadable body: denied as `invalid_request`, the problem in the detail."""
    messages: tuple[MessageVerdict, ...] = ()
    if error.has_id:
        refused = MessageVerdict(
            Verdict.DENY, Reason.INVALID_REQUEST, None, str(error), id=error.rpc_id, has_id=True
        )
        messages = (refused,)
    return BodyVerdict(Verdict.DENY, Reason.INVALID_REQUEST, None, str(error), messages, problem=error.code)


def combine(verdicts: Sequence[MessageVerdict], *, batch: bool) -> BodyVerdict:
    """A body's verdict from its messages': any deny refuses all, else any ask holds all."""
    denied = next((v for v in verdicts if v.verdict is Verdict.DENY), None)
    if denied is not None:
        detail = f"batch member {denied.index} was denied ({denied.reason})"
        refused = tuple(
            v
            if v.verdict is Verdict.DENY
            else replace(
                v, verdict=Verdict.DENY, reason=ProtocolReason.BATCH_REFUSED, rule=None, detail=detail
            )
            for v in verdicts
        )
        return BodyVerdict(Verdict.DENY, denied.reason, denied.rule, denied.detail, refused, batch)
    decisive = next((v for v in verdicts if v.verdict is Verdict.ASK), None) or (
        verdicts[0] if verdicts else _allow()
    )
    return BodyVerdict(
        decisive.verdict, decisive.reason, decisive.rule, decisive.detail, tuple(verdicts), batch
    )


def _placed(verdict: MessageVerdict, rpc: RpcMessage, subject: str | None) -> MessageVerdict:
    return replace(verdict, index=rpc.index, id=rpc.id, has_id=rpc.has_id, subject=subject)


# --- MCP ---------------------------------------------------------------------------------


def decide_mcp_body(
    data: bytes | str,
    section: McpSection,
    limits: JsonLimits = DEFAULT_LIMITS,
    *,
    max_batch: int = DEFAULT_MAX_BATCH,
) -> tuple[BodyVerdict, McpBody | None]:
    """Read an MCP body and decide it; an unreadable body is denied `invalid_request`."""
    try:
        body = read_mcp(parse_jsonrpc(data, limits, max_batch=max_batch))
    except ProtocolError as e:
        return _invalid(e), None
    return decide_mcp(body, section), body


def decide_mcp(body: McpBody, section: McpSection) -> BodyVerdict:
    """Decide every message of an MCP body, then the body (all or nothing)."""
    return combine([decide_mcp_message(m, section) for m in body.messages], batch=body.batch)


def decide_mcp_message(message: McpMessage, section: McpSection) -> MessageVerdict:
    """One MCP message, in this order:

    1. a response (to a server's request) is allowed: it asks for nothing;
    2. the method: a `methods.deny` glob (any case) denies, no `methods.allow` glob denies;
    3. `tools/call`: decide_tool; `resources/*` on one URI: the `resources` lists;
       `prompts/get`: the `prompts` lists (deny in any case first, then allow as written);
    4. any other allowed method is allowed.
    """
    rpc = message.rpc
    if rpc.kind is Kind.RESPONSE or rpc.method is None:
        return _placed(_allow(detail="a response"), rpc, None)
    verdict = _method_verdict(rpc.method, section.methods, "mcp.methods")
    if verdict is not None:
        return _placed(verdict, rpc, rpc.method)
    if rpc.method == TOOLS_CALL and message.tool is not None:
        return _placed(decide_tool(message.tool, message.arguments or {}, section.tools), rpc, message.tool)
    lists: McpResources | McpNames
    if rpc.method in RESOURCE_METHODS and message.uri is not None:
        lists = section.resources
        subject, where, reason = message.uri, "mcp.resources", ProtocolReason.RESOURCE_NOT_ALLOWED
    elif rpc.method == PROMPTS_GET and message.prompt is not None:
        lists = section.prompts
        subject, where, reason = message.prompt, "mcp.prompts", ProtocolReason.PROMPT_NOT_ALLOWED
    else:
        return _placed(_allow(detail=f"method {rpc.method!r} allowed"), rpc, rpc.method)
    if (i := lists.denied(subject)) is not None:
        return _placed(
            _deny(reason, f"{where}.deny[{i}]", f"{subject[:80]!r} matches a deny glob"), rpc, subject
        )
    if (i := lists.allowed(subject)) is None:
        return _placed(_deny(reason, None, f"no {where}.allow glob matches {subject[:80]!r}"), rpc, subject)
    return _placed(_allow(f"{where}.allow[{i}]"), rpc, subject)


def decide_tool(tool: str, arguments: dict[str, JsonValue], tools: McpTools) -> MessageVerdict:
    """One tool call, in this order (the name is canonical, see sandgate.policy.protocols.mcp):

    1. a `deny` glob matching in any case denies (`tool_denied`);
    2. neither an `allow` glob (in the case written) nor an `ask` glob (any case) matches:
       denied (`tool_not_allowed`);
    3. every `arguments` entry whose glob matches (any case) must pass, else denied
       (`argument_not_allowed`, naming the predicate);
    4. an `ask` glob matches: ask (`approval_required`), else allowed.
    """
    if (i := tools.denied(tool)) is not None:
        return _deny(
            ProtocolReason.TOOL_DENIED,
            f"mcp.tools.deny[{i}]",
            f"tool {tool!r} matches deny glob {tools.deny[i]!r}",
        )
    allowed, asked = tools.allowed(tool), tools.asked(tool)
    if allowed is None and asked is None:
        return _deny(ProtocolReason.TOOL_NOT_ALLOWED, None, f"no mcp.tools.allow glob matches tool {tool!r}")
    for key, predicates in tools.predicates_for(tool):
        failure = check_arguments(predicates, arguments)
        if failure is not None:
            rule = f"mcp.tools.arguments[{key}][{failure.index}]"
            return _deny(ProtocolReason.ARGUMENT_NOT_ALLOWED, rule, f"tool {tool!r}: {failure.describe()}")
    if asked is not None:
        return MessageVerdict(
            Verdict.ASK,
            Reason.APPROVAL_REQUIRED,
            f"mcp.tools.ask[{asked}]",
            f"tool {tool!r} needs an approval",
        )
    return _allow(f"mcp.tools.allow[{allowed}]")


def _method_verdict(method: str, rules: MethodRules, where: str) -> MessageVerdict | None:
    """A denial by the method lists, or None when the method may go on."""
    if (i := rules.denied(method)) is not None:
        return _deny(
            ProtocolReason.RPC_METHOD_NOT_ALLOWED, f"{where}.deny[{i}]", f"method {method[:80]!r} is denied"
        )
    if rules.allowed(method) is None:
        return _deny(
            ProtocolReason.RPC_METHOD_NOT_ALLOWED,
            None,
            f"no {where}.allow glob matches method {method[:80]!r}",
        )
    return None


# --- JSON-RPC ----------------------------------------------------------------------------


def decide_jsonrpc_body(
    data: bytes | str,
    section: JsonRpcSection,
    limits: JsonLimits = DEFAULT_LIMITS,
    *,
    max_batch: int = DEFAULT_MAX_BATCH,
) -> tuple[BodyVerdict, RpcBody | None]:
    """Read a JSON-RPC body and decide it; an unreadable body is denied `invalid_request`."""
    try:
        body = parse_jsonrpc(data, limits, max_batch=max_batch)
    except ProtocolError as e:
        return _invalid(e), None
    return decide_jsonrpc(body, section), body


def decide_jsonrpc(body: RpcBody, section: JsonRpcSection) -> BodyVerdict:
    """Each request and notification by its method (deny in any case, then allow as
    written); a response is allowed. Then the body, all or nothing."""
    verdicts = []
    for rpc in body.messages:
        if rpc.method is None:
            verdicts.append(_placed(_allow(detail="a response"), rpc, None))
            continue
        verdict = _method_verdict(rpc.method, section.methods, "jsonrpc.methods")
        if verdict is None:
            verdict = _allow(f"jsonrpc.methods.allow[{section.methods.allowed(rpc.method)}]")
        verdicts.append(_placed(verdict, rpc, rpc.method))
    return combine(verdicts, batch=body.batch)


# --- GraphQL -----------------------------------------------------------------------------


def decide_graphql_body(
    data: bytes | str,
    section: GraphqlSection,
    limits: JsonLimits = DEFAULT_LIMITS,
    graphql_limits: GraphqlLimits = DEFAULT_GRAPHQL_LIMITS,
) -> tuple[BodyVerdict, tuple[GraphqlRequest, ...]]:
    """Read a GraphQL-over-HTTP JSON body and decide it; unreadable: `invalid_request`."""
    try:
        requests = read_graphql_body(loads_strict(data, limits), graphql_limits)
    except ProtocolError as e:
        return _invalid(e), ()
    return decide_graphql(requests, section), requests


def decide_graphql(requests: Sequence[GraphqlRequest], section: GraphqlSection) -> BodyVerdict:
    """Every request of a body must pass decide_graphql_request (a batch is all or nothing)."""
    verdicts = [replace(decide_graphql_request(r, section), index=i) for i, r in enumerate(requests)]
    return combine(verdicts, batch=len(requests) > 1)


def decide_graphql_request(request: GraphqlRequest, section: GraphqlSection) -> MessageVerdict:
    """One request, in this order:

    1. a persisted query whose id is listed is allowed as it is (its text, if sent, was
       checked against the id); one not listed and sent without its text is denied;
    2. `__schema` or `__type` anywhere in the document, without `introspection: true`: denied;
    3. every operation of the document (not only the one that would run): decide_operation.
    """
    if request.persisted_hash is not None:
        if request.persisted_hash in section.persisted_queries:
            i = section.persisted_queries.index(request.persisted_hash)
            return _allow(f"graphql.persisted_queries[{i}]")
        if not request.operations:
            return _deny(
                ProtocolReason.PERSISTED_QUERY_UNKNOWN, None, "a persisted query id that is not listed"
            )
    if request.introspection and not section.introspection:
        return _deny(ProtocolReason.INTROSPECTION_NOT_ALLOWED, None, "__schema or __type in the document")
    for operation in request.operations:
        verdict = decide_operation(operation, section)
        if verdict.verdict is not Verdict.ALLOW:
            return verdict
    return _allow(detail=f"{len(request.operations)} operation(s) allowed")


def decide_operation(operation: GraphqlOperation, section: GraphqlSection) -> MessageVerdict:
    """One operation: its type, its name (deny in any case, then allow as written), each
    root field (`field` or `type.field`, likewise), then depth, aliases and fields."""
    name = operation.name or ""
    what = f"{operation.type} {name or '(anonymous)'}"
    if operation.type not in section.operation_types:
        return _deny(
            ProtocolReason.OPERATION_NOT_ALLOWED, "graphql.operation_types", f"{what}: type not allowed"
        )
    names = section.operation_names
    if (i := names.denied(name)) is not None:
        return _deny(
            ProtocolReason.OPERATION_NOT_ALLOWED, f"graphql.operation_names.deny[{i}]", f"{what}: name denied"
        )
    if names.allow is not None and names.allowed(name) is None:
        return _deny(
            ProtocolReason.OPERATION_NOT_ALLOWED, None, f"{what}: no operation_names.allow glob matches"
        )
    for field in operation.root_fields:
        verdict = _field_verdict(operation.type, field, section)
        if verdict is not None:
            return verdict
    for limit, value, bound in (
        ("max_depth", operation.depth, section.max_depth),
        ("max_aliases", operation.aliases, section.max_aliases),
        ("max_fields", operation.fields, section.max_fields),
    ):
        if value > bound:
            return _deny(
                ProtocolReason.QUERY_TOO_COMPLEX, f"graphql.{limit}", f"{what}: {value} over {limit} {bound}"
            )
    return _allow(detail=f"{what} allowed")


def _field_verdict(kind: str, field: str, section: GraphqlSection) -> MessageVerdict | None:
    """A denial of one root field, or None."""
    rules = section.root_fields
    for spelling in (field, f"{kind}.{field}"):
        if (i := rules.denied(spelling)) is not None:
            return _deny(
                ProtocolReason.FIELD_NOT_ALLOWED,
                f"graphql.root_fields.deny[{i}]",
                f"{kind} field {field!r} denied",
            )
    # Meta fields: __typename is harmless, introspection has its own switch.
    if rules.allow is None or field == "__typename" or field in INTROSPECTION_FIELDS:
        return None
    if rules.allowed(field) is None and rules.allowed(f"{kind}.{field}") is None:
        return _deny(
            ProtocolReason.FIELD_NOT_ALLOWED,
            None,
            f"no root_fields.allow glob matches {kind} field {field!r}",
        )
    return None
