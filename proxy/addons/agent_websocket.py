"""Addon: JSON-RPC and MCP inside WebSocket messages, decided message by message.

A WebSocket the policy allowed on a rule with `websocket: true` and an `mcp:` or `jsonrpc:`
section carries that section on its handshake's decision (the WebSocketSession Upgrades
keeps). Every whole message the guest sends (the layer reassembles fragments within the
message cap: sandgate.proxy.mitm.websocket_guard), after Upgrades checked it for
placeholders and counted its bytes, is, in this order:

1. counted as one request against the tenant's request limits, as the HTTP POST carrying it
   would be; over one, the session ends (CLOSE 1013) with one `rate_limited` record;
2. read as a JSON-RPC body and decided like one over HTTP (protocol_bodies.decide_body: the
   same deciders, the same bounds, the gateway config's `agent_protocols:`). A binary
   message, or a text message that is not strict, bounded JSON-RPC, is `invalid_request`;
3. allowed by the section, and the tenant's Rego reads the field it fills (`input.mcp`,
   `input.jsonrpc`): `data.sandgate.decision` asked once per message of it, exactly as about
   an HTTP body (sandgate.proxy.addons.message_rego; the input's request is the handshake's).
   A denial refuses the message (its reason, `data.sandgate.decision` as the rule, the
   policy's message as the answer's detail, never in the record); an engine fault refuses it
   with `policy_error`, in report mode too. A tenant whose Rego does not read that field is
   not asked (no engine call);
4. allowed: forwarded. Refused: dropped, and the guest gets the JSON-RPC error answer (one
   error per request id, a batch's as one array; nothing when only notifications were
   refused) as one text message, each error's `data` naming the message's record
   (`decision_id`); the session goes on. In report mode it is forwarded, its record says
   `would_deny`.

Each decided message has one record of its own, allowed ones too (a tool call over a
WebSocket is audited as one over HTTP is), carrying the `mcp` or `jsonrpc` object, the
`rego` object when the tenant's Rego was asked, and `websocket: {session, message}` (the
handshake's decision id, the message's number in the session). Step 1 bounds them: the
trail grows no faster than the tenant's requests may, and each record is written before the
next message is read. A session ended by a limit or a fault has one denial record, and its
later messages none (Upgrades refuses them unrecorded). Messages from the upstream pass
(the credential broker scrubs them).

A `graphql:` rule's WebSocket (subscriptions over graphql-ws) is not read: every guest
message on it is refused as `invalid_request`, answered with a GraphQL error.
Every hook is guarded: a fault ends the session with `internal_error` (CLOSE 1011).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

import structlog
from mitmproxy import http
from mitmproxy.websocket import WebSocketMessage

from sandgate.policy.decision import Decision, Mode
from sandgate.policy.protocols.decide import BodyVerdict
from sandgate.policy.protocols.json_strict import JsonValue
from sandgate.policy.protocols.rules import GraphqlSection
from sandgate.policy.reasons import Reason
from sandgate.policy.rego.messages import MessagesVerdict
from sandgate.proxy.addons.exchange import Exchange
from sandgate.proxy.addons.message_rego import (
    ask_messages,
    message_program,
    read_messages,
    record_detail,
    rego_facts,
)
from sandgate.proxy.addons.protocol_bodies import (
    DEFAULT_BOUNDS,
    BodyBounds,
    ReadBody,
    Section,
    Unreadable,
    body_facts,
    decide_body,
    protocol_answer,
    unreadable_verdict,
)
from sandgate.proxy.addons.tunnel_rules import limit_decision, tenant_limits
from sandgate.proxy.addons.upgrades import WebSocketSession, end_session
from sandgate.proxy.audit.records import decision_record, new_decision_id
from sandgate.proxy.context import GatewayContext
from sandgate.proxy.mitm.closer import ConnectionCloser
from sandgate.proxy.mitm.websocket_guard import request_answer

__all__ = ["AgentWebsocket"]

log = structlog.get_logger("sandgate.agent_websocket")

_STATE_KEY = "sandgate.agent_websocket"


@dataclass(slots=True)
class _Count:
    """Guest messages of one session decided so far."""

    decided: int = 0


class AgentWebsocket:
    """Decides the guest's WebSocket messages on a rule with `mcp:` or `jsonrpc:`."""

    def __init__(
        self, ctx: GatewayContext, closer: ConnectionCloser, bounds: BodyBounds = DEFAULT_BOUNDS
    ) -> None:
        self.ctx = ctx
        self.closer = closer
        self.bounds = bounds

    async def websocket_message(self, flow: http.HTTPFlow) -> None:
        found = _governed(flow)
        if found is None:
            return
        session, section, message = found
        try:
            await self._decide(flow, session, section, message)
        except Exception:
            log.exception("hook_failed", hook="agent_websocket.websocket_message")
            message.drop()
            fault = Decision.internal_error(
                session.decision.policy_version, "hook failed", mode=session.decision.mode
            )
            await end_session(self.ctx.audit, self.closer, flow, session, fault)

    async def _decide(
        self, flow: http.HTTPFlow, session: WebSocketSession, section: Section, message: WebSocketMessage
    ) -> None:
        """Count, read and decide one guest message (its section, then the tenant's Rego);
        forward it, or answer it and record why."""
        count = _count(flow)
        count.decided += 1
        where = {"websocket": {"session": session.dctx.decision_id, "message": count.decided}}
        exceeded = self._admit(session)
        if exceeded is not None:
            message.drop()
            await end_session(self.ctx.audit, self.closer, flow, session, exceeded, where)
            return
        verdict, body = _verdict(section, message, self.bounds)
        rego = await self._rego(flow, session, section, verdict, body)
        detail = verdict.detail
        if rego is not None and not rego.allowed:
            verdict, detail = rego.body, record_detail(rego)
        # Report mode relaxes a denial, never a fault of the policy engine.
        report = session.decision.mode is Mode.REPORT and not (rego is not None and rego.fault)
        dctx = replace(session.dctx, decision_id=new_decision_id())
        if verdict.allowed or report:
            decision = session.decision
        else:
            decision = session.decision.as_denial(Reason(str(verdict.reason)), detail)
            message.drop()
            answer = protocol_answer(section, verdict)
            if answer is not None and not request_answer(flow, _answer_text(answer, dctx.decision_id)):
                raise RuntimeError("the WebSocket guard is not installed: no answer can be sent")
        record = decision_record(dctx, decision, bytes_up=len(message.content))
        record.update(body_facts(section, verdict, body, report=report))
        if rego is not None:
            outcome = "allow" if rego.allowed else "would_deny" if report else "deny"
            record["rego"] = rego_facts(outcome, rego)
        record.update(where)
        if not await self.ctx.audit.emit(record) and not message.dropped:
            # Nothing goes upstream without its record: the message stays, the session ends.
            message.drop()
            fault = Decision.internal_error(
                session.decision.policy_version, "audit queue full", mode=session.decision.mode
            )
            await end_session(self.ctx.audit, self.closer, flow, session, fault, where)

    async def _rego(
        self,
        flow: http.HTTPFlow,
        session: WebSocketSession,
        section: Section,
        verdict: BodyVerdict,
        body: ReadBody,
    ) -> MessagesVerdict | None:
        """The tenant's Rego on a message its section allowed, when its modules read the field
        the section fills; None (no engine call) otherwise."""
        if not verdict.allowed or body is None:
            return None
        program = message_program(self.ctx, session.dctx.identity, section)
        if program is None:
            return None
        read = read_messages(body, section)
        return await ask_messages(self.ctx, flow, session.dctx, session.decision, program, read)

    def _admit(self, session: WebSocketSession) -> Decision | None:
        """Count the message as one request; the denial when a limit refuses it."""
        identity = session.dctx.identity
        limits = tenant_limits(self.ctx.policy, identity)
        if identity is None or limits is None:
            return None
        exceeded = self.ctx.limiter.admit(identity.tenant, identity.sandbox, limits)
        if exceeded is None:
            return None
        return limit_decision(session.decision, exceeded, within="a WebSocket message")


def _governed(flow: http.HTTPFlow) -> tuple[WebSocketSession, Section, WebSocketMessage] | None:
    """The open session whose rule decides its messages, and the guest message at hand."""
    if flow.websocket is None or not flow.websocket.messages:
        return None
    message = flow.websocket.messages[-1]
    if not message.from_client or message.dropped:
        return None  # the upstream's, or refused already (Upgrades ends the session then)
    session = Exchange.of(flow).websocket
    if not isinstance(session, WebSocketSession) or session.closed:
        return None
    section = session.decision.messages
    if section is None:
        return None
    return session, section, message


def _verdict(section: Section, message: WebSocketMessage, bounds: BodyBounds) -> tuple[BodyVerdict, ReadBody]:
    """The message read as its rule's body within `bounds` (permessage-deflate is undone by then)."""
    if isinstance(section, GraphqlSection):
        return unreadable_verdict(Unreadable("GraphQL over a WebSocket is not decided by sandgate")), None
    if not message.is_text:
        return unreadable_verdict(Unreadable("a binary WebSocket message where JSON-RPC is read")), None
    return decide_body(section, message.content, None, bounds)


def _answer_text(answer: JsonValue, decision_id: str) -> str:
    """The answer as the guest reads it, each error naming the message's record: in a JSON-RPC
    error's `data`, in a GraphQL error's `extensions`."""
    for item in answer if isinstance(answer, list) else [answer]:
        if not isinstance(item, dict):
            continue
        errors = item.get("errors")
        found = [(item.get("error"), "data")] + [
            (e, "extensions") for e in (errors if isinstance(errors, list) else [])
        ]
        for error, key in found:
            data = error.get(key) if isinstance(error, dict) else None
            if isinstance(data, dict):
                data["decision_id"] = decision_id
    return json.dumps(answer, separators=(",", ":"))


def _count(flow: http.HTTPFlow) -> _Count:
    count = flow.metadata.get(_STATE_KEY)
    if not isinstance(count, _Count):
        count = flow.metadata[_STATE_KEY] = _Count()
    return count
