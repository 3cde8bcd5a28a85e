"""Rego on the messages of a body (phase "message"): what the YAML cannot say about a tool call.

After an allow rule's `mcp:`, `jsonrpc:` or `graphql:` section allowed a body, a tenant
whose Rego reads `input.mcp`, `input.jsonrpc` or `input.graphql` (the one its section fills)
has `data.sandgate.decision` asked once per message (per operation for GraphQL), with the
request's input document in phase "message" and that message's object
(sandgate.policy.rego.message_input). A tenant whose modules never name that field is not
asked (`reads_messages`): it pays nothing.

The body's verdict follows the YAML's rules (sandgate.policy.protocols.decide): all or
nothing. A denied message refuses the body; every member is decided, so each denied one is
answered with its own reason and message, the others with `batch_refused`. The Rego
`message` is the answer's `detail` (the agent reads it); the reason is the policy's
(`policy_denied` by default). An engine fault (error, timeout, unreachable server) stops
the evaluation and refuses the body with `policy_error`, whatever the mode; the caller
relaxes a denial (never a fault) in report mode.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sandgate.policy.decision import EgressRequest, Identity
from sandgate.policy.protocols.decide import BodyVerdict, MessageVerdict, Verdict, combine
from sandgate.policy.protocols.graphql_ops import GraphqlRequest
from sandgate.policy.protocols.json_strict import JsonValue
from sandgate.policy.protocols.jsonrpc import RpcBody
from sandgate.policy.protocols.mcp import McpBody
from sandgate.policy.protocols.rules import GraphqlSection, JsonRpcSection, McpSection
from sandgate.policy.reasons import Reason
from sandgate.policy.rego.message_input import MessageInput, graphql_inputs, jsonrpc_inputs, mcp_inputs
from sandgate.policy.rego.program import DECISION_QUERY, RegoProgram
from sandgate.policy.rego.protocol import PolicyEngine, RegoQuery, RegoVerdict, fault

__all__ = [
    "REGO_RULE",
    "MessagesVerdict",
    "ReadMessages",
    "decide_messages",
    "message_inputs",
    "protocol_of",
    "reads_messages",
]

# The rule a Rego refusal names in its answer and record.
REGO_RULE = DECISION_QUERY

type Section = McpSection | JsonRpcSection | GraphqlSection
# A body as its section's reader read it: MCP or JSON-RPC messages, GraphQL requests.
type ReadMessages = McpBody | RpcBody | tuple[GraphqlRequest, ...]


def protocol_of(section: Section) -> str:
    """The input field a section's bodies fill: mcp, jsonrpc or graphql."""
    if isinstance(section, McpSection):
        return "mcp"
    return "graphql" if isinstance(section, GraphqlSection) else "jsonrpc"


def reads_messages(program: RegoProgram | None, protocol: str) -> bool:
    """Whether `program` can read `input.<protocol>` (a program whose input reads cannot be
    followed reads everything: it is asked)."""
    if program is None:
        return False
    paths = program.input_paths
    return paths is None or any(p[0] == protocol for p in paths)


def message_inputs(
    body: ReadMessages, *, session_id: str | None = None, variables: Sequence[JsonValue] = ()
) -> tuple[MessageInput, ...]:
    """The protocol objects of a body as its section read it (see message_input)."""
    if isinstance(body, McpBody):
        return mcp_inputs(body, session_id)
    if isinstance(body, RpcBody):
        return jsonrpc_inputs(body)
    return graphql_inputs(body, variables)


@dataclass(frozen=True, slots=True)
class MessagesVerdict:
    """What the tenant's Rego said of a body's messages. `body`: allowed, or refused whole
    (per member verdicts, as the YAML's); `fault`: an engine fault refused it."""

    body: BodyVerdict
    evaluated: int
    fault: bool = False

    @property
    def allowed(self) -> bool:
        return self.body.allowed


async def decide_messages(
    engine: PolicyEngine,
    program: RegoProgram,
    identity: Identity,
    request: EgressRequest,
    ip: str | None,
    inputs: Sequence[MessageInput],
    *,
    batch: bool,
) -> MessagesVerdict:
    """Ask data.sandgate.decision about each message (stopping at a fault), then the body."""
    asked: list[tuple[MessageInput, RegoVerdict]] = []
    for item in inputs:
        query = RegoQuery.for_message(program, identity, request, ip, item.field)
        try:
            verdict = await engine.evaluate(query)
        except Exception as e:
            verdict = fault(f"the policy engine failed ({type(e).__name__})")
        asked.append((item, verdict))
        if verdict.fault:
            break
    members = _members(inputs, asked)
    return MessagesVerdict(
        combine(members, batch=batch),
        evaluated=len(asked),
        fault=any(v.fault for _, v in asked),
    )


def _members(
    inputs: Sequence[MessageInput], asked: Sequence[tuple[MessageInput, RegoVerdict]]
) -> list[MessageVerdict]:
    """One verdict per body member (GraphQL: per request, its first refused operation)."""
    out: dict[int | None, MessageVerdict] = {}
    for item in inputs:
        out.setdefault(item.index, _message_verdict(item, None))
    for item, verdict in asked:
        if not verdict.allowed and out[item.index].verdict is Verdict.ALLOW:
            out[item.index] = _message_verdict(item, verdict)
    return list(out.values())


def _message_verdict(item: MessageInput, verdict: RegoVerdict | None) -> MessageVerdict:
    """A member allowed (verdict None or allowing) or refused by the policy's verdict."""
    if verdict is None or verdict.allowed:
        return MessageVerdict(
            Verdict.ALLOW, Reason.ALLOWED, REGO_RULE, "", item.subject, item.index, item.id, item.has_id
        )
    detail = verdict.message or f"denied by {REGO_RULE}"
    return MessageVerdict(
        Verdict.DENY, verdict.reason, REGO_RULE, detail, item.subject, item.index, item.id, item.has_id
    )
