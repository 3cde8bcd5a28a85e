"""The tenant's Rego on the messages an agent-protocol section allowed (phase "message"), as
both carriers ask it: an HTTP body (sandgate.proxy.addons.agent_rego) and a WebSocket
message (sandgate.proxy.addons.agent_websocket).

`message_program` is the cheap test each carrier makes first: the tenant's program when its
modules read the field the section fills (`input.mcp`, `input.jsonrpc`, `input.graphql`;
sandgate.policy.rego.messages.reads_messages), else None, and no engine is called. Then
`ask_messages` asks `data.sandgate.decision` once per message with the request's input
document (for a WebSocket message: the handshake's request) and that message's object;
an engine fault is a `policy_error` verdict (`MessagesVerdict.fault`), never an exception.
What the carrier records comes from here too: `record_detail` (never the policy's message,
which may quote an argument) and `rego_facts` (the record's `rego` object).
"""

from __future__ import annotations

from collections.abc import Sequence

from mitmproxy import http

from sandgate.policy.decide import default_engine
from sandgate.policy.decision import Decision, EgressRequest, Identity, Phase
from sandgate.policy.paths import read_target
from sandgate.policy.protocols.decide import Verdict
from sandgate.policy.protocols.graphql_ops import GraphqlRequest
from sandgate.policy.protocols.json_strict import JsonValue
from sandgate.policy.protocols.jsonrpc import RpcBody
from sandgate.policy.protocols.mcp import McpBody
from sandgate.policy.protocols.rules import GraphqlSection, McpSection
from sandgate.policy.rego.messages import (
    REGO_RULE,
    MessagesVerdict,
    ReadMessages,
    decide_messages,
    message_inputs,
    protocol_of,
    reads_messages,
)
from sandgate.policy.rego.program import RegoProgram
from sandgate.policy.upgrade import requested_upgrade
from sandgate.proxy.addons.guest_peer import peer_ip
from sandgate.proxy.addons.limits import declared_length
from sandgate.proxy.addons.protocol_bodies import Section
from sandgate.proxy.audit.records import DecisionContext
from sandgate.proxy.context import GatewayContext

__all__ = ["ask_messages", "message_program", "read_messages", "record_detail", "rego_facts"]


def message_program(ctx: GatewayContext, identity: Identity | None, section: Section) -> RegoProgram | None:
    """The tenant's program when it reads the messages `section` reads; else None (not asked)."""
    tenant = ctx.policy.tenant(identity.tenant) if identity is not None else None
    program = tenant.rego if tenant is not None else None
    if program is None or not reads_messages(program, protocol_of(section)):
        return None
    return program


async def ask_messages(
    ctx: GatewayContext,
    flow: http.HTTPFlow,
    dctx: DecisionContext,
    decision: Decision,
    program: RegoProgram,
    body: ReadMessages,
    *,
    variables: Sequence[JsonValue] = (),
) -> MessagesVerdict:
    """The tenant's Rego on each message of `body`, read from `flow`'s request (an HTTP body, or
    a message of the WebSocket that request opened), which `decision` allowed."""
    inputs = message_inputs(body, session_id=flow.request.headers.get("mcp-session-id"), variables=variables)
    identity = dctx.identity
    if identity is None or dctx.host is None or dctx.port is None:
        raise RuntimeError("an allowed exchange without its identity or destination")
    broker = ctx.broker
    credentials = broker.bound_names(identity.tenant, dctx.host, dctx.port) if broker is not None else ()
    egress = _egress_request(flow, dctx, credentials)
    engine = ctx.engine or default_engine()
    batch = body.batch if isinstance(body, McpBody | RpcBody) else len(body) > 1
    return await decide_messages(engine, program, identity, egress, decision.address, inputs, batch=batch)


def read_messages(read: object, section: Section) -> ReadMessages:
    """A body as its section's reader read and allowed it, of the kind the section reads."""
    if isinstance(section, McpSection):
        if isinstance(read, McpBody):
            return read
    elif isinstance(section, GraphqlSection):
        if isinstance(read, tuple) and all(isinstance(r, GraphqlRequest) for r in read):
            return read
    elif isinstance(read, RpcBody):
        return read
    raise TypeError(f"a {type(read).__name__} read for a {type(section).__name__}")


def record_detail(verdict: MessagesVerdict) -> str:
    """The record's detail: the refused member, never the policy's message (it may quote an
    argument); a fault's or an unknown length's own text (no request data in either)."""
    body = verdict.body
    if verdict.fault or verdict.evaluated == 0:
        return body.detail
    denied = next((m for m in body.messages if m.verdict is Verdict.DENY and m.rule == REGO_RULE), None)
    where = "the message" if denied is None or denied.index is None else f"batch member {denied.index}"
    return f"{REGO_RULE} denied {where} ({body.reason})"


def rego_facts(outcome: str, verdict: MessagesVerdict) -> dict[str, object]:
    """The record's `rego` object: the phase, what came of it, how many evaluations."""
    facts: dict[str, object] = {"phase": "message", "verdict": outcome, "evaluated": verdict.evaluated}
    if outcome != "allow":
        facts.update(reason=str(verdict.body.reason), rule=verdict.body.rule)
    return facts


def _egress_request(
    flow: http.HTTPFlow, dctx: DecisionContext, credentials: tuple[str, ...]
) -> EgressRequest:
    """The request as the request gate decided it (its input document's request fields)."""
    assert dctx.host is not None and dctx.port is not None
    target = read_target(flow.request.path)
    headers = tuple(flow.request.headers.items(multi=True))
    return EgressRequest(
        Phase.REQUEST,
        dctx.host,
        dctx.port,
        scheme=flow.request.scheme,
        method=flow.request.method,
        path=target.path,
        sni=dctx.sni,
        query=target.query,
        headers=headers,
        body_size=declared_length(flow.request),
        client=peer_ip(flow.client_conn.peername),
        credentials=credentials,
        upgrade=requested_upgrade(headers),
    )
